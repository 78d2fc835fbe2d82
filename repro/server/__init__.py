"""The server door (issue 22): a real vLLM OpenAI server started by the engine process on 127.0.0.1 and driven
over HTTP.  ``door`` plays the scenarios through it, ``process`` starts, waits for and stops the server,
``args`` turns the engine door's arguments into the server's flags, ``http_llm`` is the httpx adapter the
scenario drivers play, ``endpoints`` says per release which endpoint and parameter exists, and ``probe`` is the
harness's own loopback probe routes inside the server.  Imports nothing at package import: the shim imports
``probe`` in every vLLM process.
"""
