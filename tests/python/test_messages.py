"""Every error message fits the 255 bytes ExecuTorch keeps of a log line.

The test collects each kiln_fail(...) call in the C, CUDA and C++ sources and the command-line
tool, takes its format (adjacent string literals), and computes its longest expansion: each
conversion counts the most characters its argument can print. A %s without a precision bound, a
conversion the rule does not know, or a format that is not a literal is a failure naming the
file and line. A last test proves that the build's printf-format checking is on.
"""

import glob
import os
import re
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LIMIT = 255
# The collector must find at least this many formats, so it cannot pass on nothing.
MIN_FORMATS = 200

# Longest output of each conversion whose argument is not a string.
WIDTHS = {"d": 11, "i": 11, "u": 10, "x": 8, "lld": 20, "lli": 20, "llu": 20, "llx": 16, "c": 1,
          "g": 14}
CONVERSION = re.compile(r"%([-+ #0]*)(\*|\d*)(?:\.(\*|\d*))?(hh|h|ll|l|z|j|t|L)?(.)", re.S)


def source_files():
    patterns = ["src/**/*.c", "src/**/*.cu", "src/**/*.cpp", "src/**/*.h", "src/**/*.cuh",
                "tools/*.c", "tools/*.h"]
    files = set()
    for pattern in patterns:
        files.update(glob.glob(os.path.join(ROOT, pattern), recursive=True))
    return sorted(files)


def blank_comments(text):
    """Replaces comments with spaces (keeping newlines), leaving string literals intact."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def call_arguments(text, open_paren):
    """The top-level arguments of the call whose '(' is at open_paren, as source strings."""
    args, depth, start, i = [], 0, open_paren + 1, open_paren
    while i < len(text):
        c = text[i]
        if c in "\"'":
            j = i + 1
            while j < len(text) and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            i = j + 1
            continue
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth == 0:
                args.append(text[start:i])
                return args
        elif c == "," and depth == 1:
            args.append(text[start:i])
            start = i + 1
        i += 1
    return None


LITERALS = re.compile(r'\s*(?:"((?:[^"\\\n]|\\.)*)"\s*)+\Z', re.S)
ONE_LITERAL = re.compile(r'"((?:[^"\\\n]|\\.)*)"', re.S)
ESCAPE = re.compile(r"\\(x[0-9a-fA-F]+|[0-7]{1,3}|.)", re.S)
SIMPLE_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'", "?": "?",
                  "a": "\a", "b": "\b", "f": "\f", "v": "\v"}


def decode_literal(body):
    def one(m):
        e = m.group(1)
        if e[0] == "x":
            return chr(int(e[1:], 16))
        if e[0] in "01234567":
            return chr(int(e, 8))
        if e in SIMPLE_ESCAPES:
            return SIMPLE_ESCAPES[e]
        raise ValueError(f"unknown escape \\{e}")
    return ESCAPE.sub(one, body)


def format_of(argument):
    """The format a kiln_fail argument spells, or None when it is not only string literals."""
    if not LITERALS.match(argument):
        return None
    return "".join(decode_literal(m.group(1)) for m in ONE_LITERAL.finditer(argument))


def longest_expansion(fmt):
    """(length, problems): the longest message fmt can produce, and what the rule refuses."""
    length, problems, pos = 0, [], 0
    for m in CONVERSION.finditer(fmt):
        length += len(fmt[pos:m.start()].encode())
        pos = m.end()
        flags, width, precision, size, conv = m.groups()
        spec = m.group(0)
        if "*" in (width, precision):
            problems.append(f"{spec} takes its width from an argument; write a literal bound")
            continue
        if conv == "%" and not (flags or width or precision is not None or size):
            length += 1
        elif conv == "s" and not size:
            if not precision:
                problems.append(f"{spec} has no precision bound; write %.Ns")
                continue
            length += max(int(precision), int(width or 0))
        elif precision is None and (size or "") + conv in WIDTHS:
            length += max(WIDTHS[(size or "") + conv], int(width or 0))
        else:
            problems.append(f"{spec} is not a conversion the message rule knows")
    length += len(fmt[pos:].encode())
    return length, problems


def forwarding_macros(clean):
    """{name: (index of the parameter passed as kiln_fail's format, span of the #define)} for
    macros like `#define BAD(...) kiln_fail(err, STATUS, __VA_ARGS__)`."""
    macros = {}
    for d in re.finditer(r"#[ \t]*define[ \t]+(\w+)\(([^)]*)\)([^\n]*)", clean):
        params = [p.strip() for p in d.group(2).split(",")]
        body = d.group(3)
        for call in re.finditer(r"\bkiln_fail\s*\(", body):
            args = call_arguments(body, call.end() - 1)
            fmt = args[2].strip() if args and len(args) >= 3 else ""
            if fmt == "__VA_ARGS__" and "..." in params:
                macros[d.group(1)] = (params.index("..."), d.span())
            elif fmt in params:
                macros[d.group(1)] = (params.index(fmt), d.span())
    return macros


def collect(path, text):
    """[(where, format or None)] for every kiln_fail call in text (definitions skipped), and for
    every use of a macro that forwards its argument to kiln_fail as the format."""
    found = []
    joined = text.replace("\\\n", "  ")  # line continuations; positions stay those of text
    clean = blank_comments(joined)
    macros = forwarding_macros(clean)
    spans = [span for _, span in macros.values()]

    def where(pos):
        return f"{os.path.relpath(path, ROOT)}:{text.count(chr(10), 0, pos) + 1}"

    calls = [(m, 2) for m in re.finditer(r"\bkiln_fail\s*\(", clean)]
    for name, (index, _) in macros.items():
        calls += [(m, index) for m in re.finditer(r"\b" + name + r"\s*\(", clean)]
    for m, index in sorted(calls, key=lambda c: c[0].start()):
        if any(start <= m.start() < end for start, end in spans):
            continue  # inside a forwarding #define: checked at each use
        args = call_arguments(clean, m.end() - 1)
        if args is None or len(args) <= index:
            found.append((where(m.start()), None))
            continue
        if index == 2 and re.match(r"\s*kiln_error\s*\*", args[0]):
            continue  # the declaration or the definition
        found.append((where(m.start()), format_of(args[index])))
    return found


def check_formats(found):
    """Failure lines for the collected formats; empty when every one is within the limit."""
    failures = []
    for where, fmt in found:
        if fmt is None:
            failures.append(f"{where}: the format is not a string literal passed to kiln_fail")
            continue
        length, problems = longest_expansion(fmt)
        failures += [f"{where}: {p}" for p in problems]
        if length > LIMIT:
            failures.append(f"{where}: can expand to {length} bytes, more than {LIMIT}: {fmt!r}")
    return failures


@pytest.fixture(scope="module")
def formats():
    found = []
    for path in source_files():
        with open(path, encoding="utf-8") as f:
            found += collect(path, f.read())
    return found


def test_the_collector_finds_the_formats(formats):
    assert len(formats) >= MIN_FORMATS, f"only {len(formats)} kiln_fail formats found"
    files = {where.rsplit(":", 1)[0] for where, _ in formats}
    for expected in ["src/runtime/blob.c", "src/runtime/metadata.c", "tools/pte_reader.c",
                     "tools/cmd_inspect.c"]:
        assert expected in files


def test_every_message_fits_in_255_bytes(formats):
    failures = check_formats(formats)
    assert not failures, "\n".join(failures)


def test_every_message_is_one_line(formats):
    multi = [where for where, fmt in formats if fmt is not None and "\n" in fmt]
    assert not multi, f"messages with a newline: {multi}"


def test_the_rule_refuses_what_it_must():
    source = r'''
    kiln_status kiln_fail(kiln_error *err, kiln_status status, const char *fmt, ...) { }
    static kiln_status f(kiln_error *err, const char *name, int n) {
      /* kiln_fail(err, 1, "%s in a comment is not a call"); */
      if (n == 0) return kiln_fail(err, KILN_ERR_INTERNAL, "fine: %.16s has %d (%u) %llu %%", name, n, 1u, 2ull);
      if (n == 1) return kiln_fail(err, KILN_ERR_INTERNAL, "unbounded %s", name);
      if (n == 2) return kiln_fail(err, KILN_ERR_INTERNAL, name);
      if (n == 3) return kiln_fail(err, KILN_ERR_INTERNAL, "size %zu and %ld", (size_t)n, 1L);
      if (n == 4) return kiln_fail(err, KILN_ERR_INTERNAL, "%.200s and then %.60s", name, name);
      if (n == 5) return kiln_fail(err, KILN_ERR_INTERNAL, "%.*s", n, name);
      if (n == 6) return BAD("forwarded %.8s", name);
      if (n == 7) return BAD("forwarded %s", name);
      return kiln_fail(err, KILN_ERR_INTERNAL, "two " "parts " \
                       "%.239s", name);
    }
    #define BAD(...) kiln_fail(err, KILN_ERR_INVALID_PROGRAM, \
                               __VA_ARGS__)
    '''
    found = collect(os.path.join(ROOT, "synthetic.c"), source)
    assert [fmt for _, fmt in found] == [
        "fine: %.16s has %d (%u) %llu %%", "unbounded %s", None, "size %zu and %ld",
        "%.200s and then %.60s", "%.*s", "forwarded %.8s", "forwarded %s", "two parts %.239s"]
    assert longest_expansion("fine: %.16s has %d (%u) %llu %%") == (6 + 16 + 5 + 11 + 2 + 10 + 2 + 20 + 2, [])
    assert longest_expansion("two parts %.239s") == (249, [])
    assert longest_expansion("%.245s and %g") == (245 + 5 + 14, [])
    failures = check_formats(found)
    assert failures == [
        "synthetic.c:6: %s has no precision bound; write %.Ns",
        "synthetic.c:7: the format is not a string literal passed to kiln_fail",
        "synthetic.c:8: %zu is not a conversion the message rule knows",
        "synthetic.c:8: %ld is not a conversion the message rule knows",
        "synthetic.c:9: can expand to 270 bytes, more than 255: '%.200s and then %.60s'",
        "synthetic.c:10: %.*s takes its width from an argument; write a literal bound",
        "synthetic.c:12: %s has no precision bound; write %.Ns",
    ]


def project_warning_flags():
    """The KILN_C_WARNINGS list from the top-level CMakeLists.txt."""
    with open(os.path.join(ROOT, "CMakeLists.txt"), encoding="utf-8") as f:
        text = f.read()
    m = re.search(r"set\(KILN_C_WARNINGS\s+([^)]*)\)", text)
    assert m, "CMakeLists.txt no longer sets KILN_C_WARNINGS"
    flags = m.group(1).split()
    assert "-Werror" in flags and any(f.startswith("-Wformat") for f in flags)
    return flags


def compilers():
    found = [c for c in ("cc", "clang") if shutil.which(c)]
    assert found, "no C compiler on PATH"
    return found


@pytest.mark.parametrize("compiler", compilers())
def test_a_placeholder_without_its_argument_fails_the_build(compiler, tmp_path):
    flags = project_warning_flags()

    def compiles(call):
        source = tmp_path / "snippet.c"
        source.write_text('#include "kiln/kiln.h"\n'
                          "kiln_status check(kiln_error *err, unsigned n);\n"
                          "kiln_status check(kiln_error *err, unsigned n) {\n"
                          f"  return {call};\n"
                          "}\n")
        r = subprocess.run([compiler, "-std=c11", "-fsyntax-only", *flags,
                            "-I", os.path.join(ROOT, "include"), str(source)],
                           capture_output=True, text=True)
        return r.returncode == 0, r.stderr

    ok, err = compiles('kiln_fail(err, KILN_ERR_INTERNAL, "op %u of %u failed", n, n + 1)')
    assert ok, err  # the control: a correct call compiles with the same flags
    ok, err = compiles('kiln_fail(err, KILN_ERR_INTERNAL, "op %u of %u failed", n)')
    assert not ok and "format" in err
    ok, err = compiles('kiln_fail(err, KILN_ERR_INTERNAL, "op %.16s failed", n)')
    assert not ok and "format" in err
