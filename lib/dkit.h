#pragma once

/// The whole dkit library: `#include <dkit/dkit.h>`.

#include <dkit/config.h>
#include <dkit/checkpoint/optimizer_kind.h>
#include <dkit/checkpoint/pickle.h>
#include <dkit/checkpoint/safetensors.h>
#include <dkit/checkpoint/state_dict.h>
#include <dkit/checkpoint/torch_file.h>
#include <dkit/checkpoint/training_checkpoint.h>
#include <dkit/core/enum_names.h>
#include <dkit/core/error.h>
#include <dkit/core/format.h>
#include <dkit/data/dataset.h>
#include <dkit/data/loader.h>
#include <dkit/data/mapped.h>
#include <dkit/device/device.h>
#include <dkit/device/host_sync.h>
#include <dkit/device/report.h>
#include <dkit/distributed/data_parallel.h>
#include <dkit/distributed/gradient_reducer.h>
#include <dkit/distributed/launch.h>
#include <dkit/distributed/process_group.h>
#include <dkit/metrics/event_file.h>
#include <dkit/metrics/metrics.h>
#include <dkit/model/mlp.h>
#include <dkit/model/mlp_file.h>
#include <dkit/train/amp.h>
#include <dkit/train/config.h>
#include <dkit/train/mlp_task.h>
#include <dkit/train/optim.h>
#include <dkit/train/step.h>
#include <dkit/train/schedule.h>
#include <dkit/train/task.h>
#include <dkit/train/trainer.h>
