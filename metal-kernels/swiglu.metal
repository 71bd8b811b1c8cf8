// out = silu(gate) * up, elementwise; one thread per element (grid = size).
uint elem = thread_position_in_grid.x;
float g = static_cast<float>(gate[elem]);
float u = static_cast<float>(up[elem]);
out[elem] = static_cast<T>(g / (1.0f + metal::exp(-g)) * u);
