/* dropless.h: the one public header of libdropless.
 *
 * libdropless is an exact, bit-reproducible reference for token-dropless
 * Mixture-of-Experts layers: every stage's value is the exact real result of
 * that stage's function of the stored (rounded) outputs before it, rounded
 * once, ties to even, to the stage's storage type. Same bits on every
 * machine, thread count and compiler.
 *
 * Sections (each its own file under dropless/, all included here):
 *   core     errors, storage types, rounding, the exact accumulator
 *   route    router logits, softmax/sigmoid scores, top-k, tie margins
 *   dispatch argsort, group sizes and offsets, permute, combine
 *   gemm     exact grouped GEMM over a flat ragged array, ragged-K GEMM
 *   lowp     FP8/FP4 element and scale formats (quant: block quantization,
 *            block-scaled GEMM; quantcheck: their checks)
 *   moe      the whole layer: configuration, forward, backward
 *   shared   shared experts: the gate, the combine and input gradient with them
 *   values   the one table of the layer's arrays (DL_VALUE_MAP) and stage values
 *   schedule the one schedule of the layer: its producers and the scheduler
 *   features what configure chose (--enable-extra-value)
 *   ep       expert parallelism: the dispatch layout of R ranks (DeepEP's)
 *   layout   kernel layouts: DeepGEMM masked/contiguous, vLLM block/batched
 *   golden   golden files (HDF5): the case catalogue, write, read
 *   mutate   mutated candidates of a golden: the runner's test of itself
 *   check    the conformance runner
 *   capacity capacity-factor routing and its cost: the legacy baseline
 * The plugin ABI for backends is dropless/backend.h, which depends on DLPack
 * alone and is not included here.
 */
#ifndef DROPLESS_H
#define DROPLESS_H

#include "dropless/core.h"
#include "dropless/route.h"
#include "dropless/dispatch.h"
#include "dropless/gemm.h"
#include "dropless/lowp.h"
#include "dropless/quant.h"
#include "dropless/quantcheck.h"
#include "dropless/qgolden.h"
#include "dropless/moe.h"
#include "dropless/shared.h"
#include "dropless/values.h"
#include "dropless/schedule.h"
#include "dropless/ep.h"
#include "dropless/layout.h"
#include "dropless/run.h"
#include "dropless/check.h"
#include "dropless/golden.h"
#include "dropless/mutate.h"
#include "dropless/capacity.h"
#include "dropless/api.h"

#endif
