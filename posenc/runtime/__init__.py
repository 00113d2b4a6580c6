"""The run machinery every long job shares: atomic file writes (``atomic``), folder locks (``lock``), finished
cells kept on disk so a run resumes where it stopped (``cells``), SIGINT/SIGTERM recorded and honoured between
steps (``interrupt``) and a process pool of independent jobs (``parallel``). Imports nothing of posenc."""
