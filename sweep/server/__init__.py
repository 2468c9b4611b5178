"""The server wing: a server's life on a host.

``executor`` runs commands (local subprocess or SSH); ``lifecycle`` starts, follows and stops
one server; ``readiness`` judges it ready; ``hygiene`` checks the port and GPUs are free;
``engine_check`` asks the engine on the host about itself (a study becomes what the lifecycle
needs in :mod:`sweep.loop.wiring`).
"""
