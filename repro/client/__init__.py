"""The client door (issue 36): an RL framework's own released client code drives the project's vLLM server.

``clients`` is the table of framework clients (package, module, the calls the door makes through it, and every
stand-in with its reason), pure data read by both sides; ``side`` runs in the framework's side environment (its
released package installed with ``--no-deps``) and calls the framework's client on request; ``door`` is the
engine process's half: the server door's HTTP adapter with the pause and resume made by the framework's client,
and the cell's preconditions (async in EngineCore, requests in flight at the pause, the framework's calls in the
server's access log).  Imports nothing at package import.
"""
