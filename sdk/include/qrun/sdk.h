// qrun/sdk.h - everything a plugin includes. See each header for its contract.
#pragma once

#include <qrun/sdk/batch.h>
#include <qrun/sdk/component.h>
#include <qrun/sdk/config.h>
#include <qrun/sdk/data.h>
#include <qrun/sdk/error.h>
#include <qrun/sdk/kernels.h>
#include <qrun/sdk/log.h>
#include <qrun/sdk/model.h>
#include <qrun/sdk/ops.h>
#include <qrun/sdk/plugin.h>
#include <qrun/sdk/run.h>
