/* dropless/route.h: see dropless.h for the section map. */
#ifndef DROPLESS_ROUTE_H
#define DROPLESS_ROUTE_H
#include "core.h"
#ifdef __cplusplus
extern "C" {
#endif

#ifdef __cplusplus
}
#endif
#endif
