#pragma once

// The pickle subset of `torch.save` files: the value type (pickle_value.h), dkit's restricted unpickler
// (unpickler.h) and its pickler (pickler.h).

#include <dkit/checkpoint/pickle_value.h>
#include <dkit/checkpoint/pickler.h>
#include <dkit/checkpoint/unpickler.h>
