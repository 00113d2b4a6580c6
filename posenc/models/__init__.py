"""Layer 4, models: the small decoder the lab trains (``tinylm``), its KV cache (``cache``) and
generation (``generation``)."""
