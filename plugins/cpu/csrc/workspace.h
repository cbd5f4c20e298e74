/* The layout of tp_workspace (opaque in tp.h): one engine's scratch, owned by its engine (no
 * process globals: two engines in one process never share scratch). */
#ifndef TP_WORKSPACE_H
#define TP_WORKSPACE_H

#include <stddef.h>

#include "tp.h"

struct tp_workspace {
  size_t cap;        /* bytes at base */
  char *base;        /* forward.c: the step's activations, 64-byte aligned */
  size_t parts_cap;  /* floats at parts */
  float *parts;      /* attention.c: partials of queries over several context partitions */
};

#endif
