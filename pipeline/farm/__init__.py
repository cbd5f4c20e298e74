"""The build farm: build and validate every recipe x target on a node that has that target's
hardware (Ray), publish fingerprinted artifacts to a store (fsspec), pull them onto a device.

One concept per file:

- :mod:`.store`  the artifact store, ``<store>/<recipe>/<target>/<build_hash>/`` + ``latest``
- :mod:`.node`   what a node can build (probe) and the ``ray start`` command that says so
- :mod:`.tasks`  the Ray task that builds, validates and publishes one cell
- :mod:`.matrix` the recipe x target report (markdown, JSON, exit code)
- :mod:`.run`    the driver: connect, check resources, submit, collect, cancel on Ctrl-C
- :mod:`.cli`    ``trtpipe farm build``, ``trtpipe farm node``, ``trtpipe pull``

Ray and fsspec are imported lazily (extra ``farm``), so ``trtpipe --help`` never needs them.
"""
