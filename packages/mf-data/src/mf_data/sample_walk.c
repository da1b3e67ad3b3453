/* The sample-index walk of mf_data.gpt_indices, compiled at first use by compiled_walk.py.
 *
 * Row k of the sample index is where sample k starts: a position in the document index and
 * a token offset into that sequence. Each sample spans seq_length + extra tokens (the extra
 * token is re-read as the first token of the next sample). When the tokens run out, the walk
 * stays on the last position with offset length - extra, as megatron-core's helpers.cpp does.
 * The caller checks that every sequence id lies within `lengths`. `out` holds `rows` pairs
 * (position, offset), row-major, in the sample index's own integer type.
 */
#include <stdint.h>

#define MF_SAMPLE_WALK(NAME, OUT_TYPE)                                                      \
    void NAME(const int32_t *lengths, const int32_t *document_index,                        \
              int64_t document_count, int64_t seq_length, int64_t extra, int64_t rows,       \
              OUT_TYPE *out)                                                                 \
    {                                                                                        \
        int64_t position = 0;                                                                \
        int64_t offset = 0;                                                                  \
        for (int64_t row = 0; row < rows; ++row) {                                           \
            int64_t remaining = seq_length + extra;                                          \
            while (remaining != 0) {                                                         \
                int64_t length = lengths[document_index[position]];                          \
                int64_t left = length - offset;                                              \
                remaining -= left;                                                           \
                if (remaining <= 0) {                                                        \
                    offset += remaining + left - extra;                                      \
                    remaining = 0;                                                           \
                } else if (position == document_count - 1) {                                 \
                    offset = length - extra;                                                 \
                    remaining = 0;                                                           \
                } else {                                                                     \
                    ++position;                                                              \
                    offset = 0;                                                              \
                }                                                                            \
            }                                                                                \
            out[2 * row] = (OUT_TYPE)position;                                               \
            out[2 * row + 1] = (OUT_TYPE)offset;                                             \
        }                                                                                    \
    }

MF_SAMPLE_WALK(mf_sample_walk_int32, int32_t)
MF_SAMPLE_WALK(mf_sample_walk_int64, int64_t)
