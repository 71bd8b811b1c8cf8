// out = silu(gate) * up, elementwise; grid = size threads (rounded up to whole
// blocks by MLX, hence the bound check).
auto elem = cooperative_groups::this_grid().thread_rank();
size_t n = 1;
for (int i = 0; i < gate_ndim; ++i) {
  n *= gate_shape[i];
}
if (elem >= n) {
  return;
}
float g = static_cast<float>(gate[elem]);
float u = static_cast<float>(up[elem]);
out[elem] = static_cast<T>(g / (1.0f + expf(-g)) * u);
