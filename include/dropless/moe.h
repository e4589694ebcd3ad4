/* dropless/moe.h: see dropless.h for the section map. */
#ifndef DROPLESS_MOE_H
#define DROPLESS_MOE_H
#include "core.h"
#ifdef __cplusplus
extern "C" {
#endif

#ifdef __cplusplus
}
#endif
#endif
