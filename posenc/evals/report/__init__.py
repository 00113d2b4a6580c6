"""Reports: the lab's (``lab``, with its headline, retrieval tables, document and ``posenc eval`` page:
``headline``, ``retrieval``, ``doc``, ``evaluation``; scheme families and colours: ``families``) and the
suite's (``suite``)."""
