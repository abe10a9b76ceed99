// The CUDA arm's own store policy (host code): the device has no order
// between tokens, so where two tokens name one slot the earlier ones are
// cleared before the launch and the later token's values are kept, as
// vt_kv_store keeps them on the CPU. Host C++ only; no kernel.
#include <algorithm>
#include <cstdint>
#include <new>
#include <utility>
#include <vector>

#include "vt_cuda.h"

extern "C" int64_t vt_cuda_clear_repeated_slots(int64_t *slots, int64_t n) {
    try {
        std::vector<std::pair<int64_t, int64_t>> pairs;  // (slot, token)
        pairs.reserve(static_cast<size_t>(n > 0 ? n : 0));
        for (int64_t t = 0; t < n; t++)
            if (slots[t] >= 0) pairs.emplace_back(slots[t], t);
        std::sort(pairs.begin(), pairs.end());
        int64_t cleared = 0;
        for (size_t i = 0; i + 1 < pairs.size(); i++)
            if (pairs[i].first == pairs[i + 1].first) {
                slots[pairs[i].second] = -1;
                cleared++;
            }
        return cleared;
    } catch (const std::bad_alloc &) {
        return -1;
    }
}
