// The lines of a small text file, numbered, for the parsers whose errors say
// "<file>:<line>: ..." (the launcher's hostfile and environment file, the tokenizer's
// merges.txt), so they split lines, drop a Windows '\r' and count alike.
//
//   TextLines lines(text, path);
//   while (lines.next()) {
//     if (lines.line().empty()) continue;
//     DS_CHECK(ok(lines.line()), lines.where() << "what is wrong");  // "path:7: what is wrong"
//   }
//
// Lines end at '\n'; a last line without one is still a line, and a text ending in '\n' has
// no empty line after it. One trailing '\r' is dropped from each line; any other byte (NUL
// included) is left to the parser. The views point into `text`, which must outlive this.
#pragma once

#include <string>
#include <string_view>
#include <utility>

namespace ds {

class TextLines {
 public:
  TextLines(std::string_view text, std::string source) : text_(text), source_(std::move(source)) {}

  // Moves to the next line; false (and no line) after the last one.
  bool next() {
    if (pos_ >= text_.size()) return false;
    std::size_t end = text_.find('\n', pos_);
    if (end == std::string_view::npos) end = text_.size();
    line_ = text_.substr(pos_, end - pos_);
    if (!line_.empty() && line_.back() == '\r') line_.remove_suffix(1);
    pos_ = end + 1;
    ++number_;
    return true;
  }

  std::string_view line() const { return line_; }  // without its '\n' (and '\r')
  int number() const { return number_; }           // 1 for the first line
  const std::string& source() const { return source_; }
  // "<source>:<number>: ", the prefix of every error about this line.
  std::string where() const { return source_ + ":" + std::to_string(number_) + ": "; }

 private:
  std::string_view text_;
  std::string source_;
  std::size_t pos_ = 0;
  std::string_view line_;
  int number_ = 0;
};

}  // namespace ds
