"""Library calls behind one-off commands: ``launch`` (one server, no search) and ``status``."""
