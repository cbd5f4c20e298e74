"""The ``trtpipe`` command line (click): the group and one module per command family; each command parses its flags and calls into its wing (stages, validate, farm, estimate, the runtime)."""
