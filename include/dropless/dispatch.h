/* dropless/dispatch.h: see dropless.h for the section map. */
#ifndef DROPLESS_DISPATCH_H
#define DROPLESS_DISPATCH_H
#include "core.h"
#ifdef __cplusplus
extern "C" {
#endif

#ifdef __cplusplus
}
#endif
#endif
