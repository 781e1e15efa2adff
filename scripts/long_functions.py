#!/usr/bin/env python3
"""Lists C++ and CUDA functions longer than a limit (80 lines by default).

A function may stay long when the comment block directly above it says why with the words
"Long on purpose:" (a table of cases, a kernel that reads best whole). Exit status 1 when
any other function is over the limit, so a test or a hook can use it.

Usage: scripts/long_functions.py [--max N] [--all] [DIR ...]   (default: apps src io mpi)
"""
import argparse
import os
import re
import sys

SOURCE_SUFFIXES = (".cpp", ".cc", ".cu", ".h", ".hpp", ".cuh")
REASON_MARK = "Long on purpose:"
SCOPE_WORDS = re.compile(r"\b(namespace|class|struct|union|enum)\b|extern\s*\"C")


def strip_code(text):
    """The text with comments, strings and character literals blanked (newlines kept)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            open_paren = text.find("(", i)
            delim = text[i + 2:open_paren]
            j = text.find(")" + delim + '"', open_paren)
            j = n if j < 0 else j + len(delim) + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c in "\"'" and not (c == "'" and i > 0 and text[i - 1].isalnum()):
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(c + " " * (j - i - 2) + c if j - i >= 2 else " " * (j - i))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def blank_preprocessor(code):
    """Blanks preprocessor directives, continuation lines included (macros are not functions)."""
    lines = code.split("\n")
    continued = False
    for k, line in enumerate(lines):
        if continued or line.lstrip().startswith("#"):
            continued = line.rstrip().endswith("\\")
            lines[k] = " " * len(line)
    return "\n".join(lines)


def functions(code):
    """Yields (head_start, body_start, body_end) offsets of each function body at file scope."""
    stack = []  # per open brace: "scope", "function" or "block"
    head_start = 0
    # Start of the function whose braces just closed at this level: a constructor's
    # "member{value}" initializer looks like a whole function, and its body follows.
    continued = None
    for i, c in enumerate(code):
        if c == "{":
            inside_function = any(entry[0] != "scope" for entry in stack)
            head = code[head_start:i]
            if inside_function:
                stack.append(("block", 0, 0))
            elif continued is not None and (not head.strip() or head.lstrip().startswith(",")):
                stack.append(("function", continued, i))
            elif SCOPE_WORDS.search(head.split("(")[0]):
                stack.append(("scope", 0, 0))
            elif "(" in head:
                stack.append(("function", head_start, i))
            else:
                stack.append(("block", 0, 0))
            head_start = i + 1
            continued = None
        elif c == "}":
            if stack:
                kind, start, body = stack.pop()
                if kind == "function":
                    yield start, body, i
                    continued = start if not any(entry[0] != "scope" for entry in stack) else None
            head_start = i + 1
        elif c == ";" and not any(entry[0] != "scope" for entry in stack):
            head_start = i + 1
            continued = None


def signature_line(code, head, body):
    """0-based line where a function's head starts, past blank lines."""
    return code.count("\n", 0, head + len(code[head:body]) - len(code[head:body].lstrip()))


def has_reason(lines, first_line):
    """True when the comment block right above line first_line (0-based) holds the mark."""
    k = first_line - 1
    while k >= 0 and lines[k].strip().startswith(("//", "*", "/*")):
        if REASON_MARK in lines[k]:
            return True
        k -= 1
    return False


def scan_file(path, limit):
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    code = blank_preprocessor(strip_code(text))
    lines = text.split("\n")
    for head, body, end in functions(code):
        first = signature_line(code, head, body)
        last = code.count("\n", 0, end)
        length = last - first + 1
        if length > limit:
            name = " ".join(code[head:body].split())[:90]
            yield first + 1, length, name, has_reason(lines, first)


def source_files(roots):
    for root in roots:
        for folder, dirs, names in os.walk(root):
            dirs.sort()
            for name in sorted(names):
                if name.endswith(SOURCE_SUFFIXES):
                    yield os.path.join(folder, name)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max", type=int, default=80, help="longest allowed function, in lines")
    parser.add_argument("--all", action="store_true", help="list the ones with a reason too")
    parser.add_argument("roots", nargs="*", default=["apps", "src", "io", "mpi"])
    args = parser.parse_args()
    unexplained = 0
    for path in source_files(args.roots):
        for line, length, name, reasoned in scan_file(path, args.max):
            if reasoned and not args.all:
                continue
            unexplained += 0 if reasoned else 1
            mark = " (reason given)" if reasoned else ""
            print(f"{path}:{line}: {length} lines{mark}: {name}")
    return 1 if unexplained else 0


if __name__ == "__main__":
    sys.exit(main())
