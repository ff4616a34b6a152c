// framework/kernel_backend.h - a component of a kernel kind seen as its KernelBackend base.
// Header-only and free of the recipe's dependencies: `qrun check`'s sources use it too.
#pragma once

#include <qrun/sdk/kernels.h>
#include <qrun/sdk/ops.h>

#include <string>

namespace qrun {

// The component of a kernel kind (attention, linear_attention, conv1d, ops) as a KernelBackend,
// nullptr for other kinds. A static cast by kind: plugins hide their symbols, so dynamic_cast
// across the library boundary is not relied on.
inline const KernelBackend* as_backend(const std::string& kind, const Component* c) {
  if (c == nullptr) return nullptr;
  if (kind == Attention::kKind) return static_cast<const Attention*>(c);
  if (kind == LinearAttention::kKind) return static_cast<const LinearAttention*>(c);
  if (kind == Conv1d::kKind) return static_cast<const Conv1d*>(c);
  if (kind == Ops::kKind) return static_cast<const Ops*>(c);
  return nullptr;
}

}  // namespace qrun
