/* dropless/gemm.h: see dropless.h for the section map. */
#ifndef DROPLESS_GEMM_H
#define DROPLESS_GEMM_H
#include "core.h"
#ifdef __cplusplus
extern "C" {
#endif

#ifdef __cplusplus
}
#endif
#endif
