"""The server's route handlers, one module per family (the table is in :mod:`..app`)."""
