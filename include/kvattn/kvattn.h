// kvattn: attention kernels for LLM serving. The one header a user includes.
#pragma once

#include "kvattn/attention.h"
#include "kvattn/cpu_threads.h"
#include "kvattn/device.h"
#include "kvattn/dtype.h"
#include "kvattn/mla.h"
#include "kvattn/problem.h"
#include "kvattn/selection.h"
#include "kvattn/status.h"
#include "kvattn/tensor.h"
#include "kvattn/version.h"
