#pragma once

/// The whole dkit library: `#include <dkit/dkit.h>`.

#include <dkit/bench/suites.h>
#include <dkit/bench/table.h>
#include <dkit/bench/timing.h>
#include <dkit/config.h>
#include <dkit/core/error.h>
#include <dkit/device/device.h>
#include <dkit/device/report.h>
#include <dkit/model/mlp.h>
