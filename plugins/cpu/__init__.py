"""Host CPU kernels (C, compiled per target ISA) and the weight layouts they read: the native CPU
backend's half that lives with the ops. ``csrc/tp.h`` documents the layouts and kernels;
:mod:`.layout` builds the layouts in NumPy, :mod:`.compile` builds the library, :mod:`.library`
binds it with ctypes, :mod:`.reference` holds the NumPy references the tests compare against."""
