"""The custom ops of the ``trtpipe`` domain, one folder per op, each from one description (its ``spec.py``); the description record type and the ops' ABI (schemas, hashes) at this level."""
