/* capacity_priv.h: internals of the capacity-factor analysis
 * (src/capacity/), the layer above the golden files: it routes cases and
 * reads golden files to measure what capacity factors cost; not installed. */
#ifndef DL_CAPACITY_PRIV_H
#define DL_CAPACITY_PRIV_H

#include "golden/golden_priv.h"
#include "dropless/capacity.h"

#endif
