// The default corpus, embedded at build time with .incbin (DS_CORPUS_PATH is set by CMake,
// which also makes this file depend on the text).
#include <string_view>

#include "ds/data/dataset.h"

#define DS_STR2(x) #x
#define DS_STR(x) DS_STR2(x)

__asm__(
    ".section .rodata\n"
    ".balign 64\n"
    "ds_data_corpus_begin:\n"
    ".incbin \"" DS_STR(DS_CORPUS_PATH) "\"\n"
    "ds_data_corpus_end:\n"
    ".byte 0\n"
    ".previous\n");

extern "C" const char ds_data_corpus_begin[] __asm__("ds_data_corpus_begin");
extern "C" const char ds_data_corpus_end[] __asm__("ds_data_corpus_end");

namespace ds::data {
std::string_view embedded_corpus() {
  return {ds_data_corpus_begin, std::size_t(ds_data_corpus_end - ds_data_corpus_begin)};
}
}  // namespace ds::data
