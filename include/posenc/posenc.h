// posenc/posenc.h — everything public.
#pragma once
#include "posenc/absolute.h"
#include "posenc/attention.h"
#include "posenc/bias.h"
#include "posenc/registry.h"
#include "posenc/rope.h"
#include "posenc/rotary.h"
#include "posenc/status.h"
#include "posenc/view.h"
