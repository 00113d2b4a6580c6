"""``posenc bench``: the lab's presets (``presets``), training that resumes (``training``, ``resume``), the
evaluation of a trained model at several lengths (``evaluate``, ``metrics``) and its probes (``probes``), and the
job that runs them all (``bench``)."""
