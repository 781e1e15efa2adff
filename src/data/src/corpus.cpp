// The default corpus, embedded at build time with .incbin (DS_CORPUS_PATH is set by CMake,
// which also makes this file depend on the text).
#include <string_view>

#include "ds/data/dataset.h"

#define DS_STR2(x) #x
#define DS_STR(x) DS_STR2(x)

// The labels are hidden globals, not local labels: a reference to a local label becomes
// "section + offset", and aarch64's GNU ld keeps one GOT entry per section for those (the
// offset dropped), so both addresses would read the section's start. Hidden symbols are
// addressed PC-relative, without the GOT, on every target.
__asm__(
    ".section .rodata\n"
    ".balign 64\n"
    ".globl ds_data_corpus_begin\n"
    ".hidden ds_data_corpus_begin\n"
    "ds_data_corpus_begin:\n"
    ".incbin \"" DS_STR(DS_CORPUS_PATH) "\"\n"
    ".globl ds_data_corpus_end\n"
    ".hidden ds_data_corpus_end\n"
    "ds_data_corpus_end:\n"
    ".byte 0\n"
    ".previous\n");

extern "C" __attribute__((visibility("hidden"))) const char ds_data_corpus_begin[] __asm__("ds_data_corpus_begin");
extern "C" __attribute__((visibility("hidden"))) const char ds_data_corpus_end[] __asm__("ds_data_corpus_end");

namespace ds::data {
std::string_view embedded_corpus() {
  return {ds_data_corpus_begin, std::size_t(ds_data_corpus_end - ds_data_corpus_begin)};
}
}  // namespace ds::data
