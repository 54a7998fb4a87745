"""The language table (sandboxes/languages.py) and the build plans (sandboxes/code_runs.py):
detection, aliases, probes and toolchain choice. Fast: no sandbox, no database."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sandboxes import languages as table
from sandboxes.code_runs import build_plan, java_class, streamed_argv

# (code, expected language): one per language, then inputs built to mislead.
DETECTION = [
    ("print(sum(range(10)))", "python"),
    ("console.log(6*7)", "node"),
    ("x", "node"),  # the seeds' fallback
    ("#!/usr/bin/env python3\nconsole.log('in a string')\n", "python"),
    ("#!/usr/bin/python3.11 -u\nx = 1\n", "python"),
    ("#!/bin/bash\nprint('not python')\n", "bash"),
    ("#!/usr/bin/env -S node --no-warnings\nlet a = 1\n", "node"),
    ("#!/usr/bin/env ruby\nputs 1\n", "ruby"),
    ("#!/usr/bin/env tsx\nconst a = 1\n", "typescript"),
    ("#!/usr/bin/lua5.4\nprint(1)\n", "lua"),
    ('package main\n\nimport "fmt"\n\nfunc main() { fmt.Println(1) }\n', "go"),
    ('package util\n\nimport (\n\t"fmt"\n)\n', "go"),
    ('fn main() {\n    println!("hi");\n}\n', "rust"),
    ("pub fn main() {}\n", "rust"),
    ("use std::io::{self, Read};\n", "rust"),
    ("public class Hello {\n  public static void main(String[] a) {}\n}\n", "java"),
    ("class Main {\n  public static void main(String[] args) {}\n}\n", "java"),
    ('#include <stdio.h>\nint main(void) { puts("hi"); }\n', "c"),
    ("#include <iostream>\nint main() { std::cout << 1; }\n", "cpp"),
    ('#include "x.h"\nint main() { std::vector<int> v; }\n', "cpp"),
    ("#include <bits/stdc++.h>\nusing namespace std;\n", "cpp"),
    ("int main() {\n  return 0;\n}\n", "c"),
    ("<?php\necho 'hi';\n", "php"),
    ("interface User { name: string }\nconst u: User = { name: 'a' };\n", "typescript"),
    ("function add(a: number, b: number): number {\n  return a + b;\n}\n", "typescript"),
    ("let count: number = 1;\n", "typescript"),
    ("echo hello\nls -la\n", "bash"),
    ("for f in *.txt; do\n  cat $f\ndone\n", "bash"),
    ('puts "hi"\n', "ruby"),
    ("[1, 2].each do |x|\n  puts x\nend\n", "ruby"),
    ('use strict;\nmy $x = 1;\nprint "$x\\n";\n', "perl"),
    ("local x = 1\nprint(x)\n", "lua"),
    # misleading: the marker of another language inside a string or a comment
    ('print("package main")\nprint("fn main() {}")\n', "python"),
    ('x = "#include <stdio.h>"\nprint(x)\n', "python"),
    ("# include this in the report\nimport os\nprint(os.getcwd())\n", "python"),
    ("def main():\n    print('public class X {')\n", "python"),
    ("// fn main() {}\nconsole.log('#include <x>')\n", "node"),
    ("const s = 'public class Foo {';\nconsole.log(s);\n", "node"),
    ("const re = /^package main/;\nconsole.log(re)\n", "node"),
    ("import json\nprint(json.dumps({'echo': 1}))\n", "python"),
    ("", "node"),
    ("\x00\x01\x02", "node"),
    ("#!", "node"),
    ("#!/usr/bin/env\n", "node"),
    ("#!/usr/bin/env cobol\n", "node"),
]


@pytest.mark.parametrize(("code", "expected"), DETECTION)
def test_detection(code: str, expected: str) -> None:
    assert table.detect_language(code) == expected


def test_every_sample_is_detected_as_its_own_language() -> None:
    ambiguous = {"lua"}  # print("...") is Python as much as Lua: the table says so
    for language in table.LANGUAGES:
        assert language.sample, language.name
        if language.name not in ambiguous:
            assert table.detect_language(language.sample) == language.name


def test_detection_of_huge_and_pathological_input_is_fast_enough_to_finish() -> None:
    # Backtracking bait for every pattern: long lines without the closing token.
    for code in (
        "class A" + " " * 200_000,
        "package main\n" + "x\n" * 100_000,
        "function f(" + "a: b, " * 20_000,
        "#include <" + "a" * 200_000,
        "package main\n" * 50_000,
        "int main(\n" * 50_000,
        "interface A<\n" * 50_000,
        "function f(a b c\n" * 20_000,
    ):
        assert table.detect_language(code) in table.BY_NAME
        assert java_class(code)


def test_detection_reads_the_top_of_the_code_only() -> None:
    from sandboxes.language_detection import DETECT_CHARS

    top = "print(1)\n" * (DETECT_CHARS // 9 + 1)
    assert table.detect_language(top + "fn main() {}\n") == "python"
    assert table.detect_language("fn main() {}\n" + top) == "rust"


def test_names_aliases_and_unknowns() -> None:
    assert table.lookup("Python3").name == "python"  # type: ignore[union-attr]
    assert table.lookup(" JS ").name == "node"  # type: ignore[union-attr]
    assert table.lookup("c++").name == "cpp"  # type: ignore[union-attr]
    assert table.lookup("golang").name == "go"  # type: ignore[union-attr]
    for extension, name in (("rs", "rust"), ("mjs", "node"), ("cc", "cpp"), ("PM", "perl")):
        assert table.lookup(extension).name == name  # type: ignore[union-attr]
    owners: dict[str, str] = {}
    for language in table.LANGUAGES:
        for key in (*language.extensions, language.name, *language.aliases):
            assert owners.setdefault(key, language.name) == language.name, key
    for unknown in ("cobol", "", "python4", "node;rm -rf /", "../bash"):
        assert table.lookup(unknown) is None
    aliases = [a for language in table.LANGUAGES for a in (language.name, *language.aliases)]
    assert len(aliases) == len(set(aliases)), "an alias names two languages"


def test_languages_in_takes_the_first_toolchain_present() -> None:
    assert table.languages_in(lambda b: False) == []
    host = {"python3", "node", "bash", "gcc", "g++", "javac", "java", "perl"}
    assert table.languages_in(host.__contains__) == [
        "python",
        "node",
        "bash",
        "c",
        "cpp",
        "java",
        "perl",
    ]
    typescript = table.BY_NAME["typescript"]
    assert typescript.toolchain({"node"}.__contains__) is None  # Node 20: no type stripping
    assert typescript.toolchain({"node", table.NODE_22}.__contains__).needs == (table.NODE_22,)  # type: ignore[union-attr]
    assert typescript.toolchain({"node", "tsc", table.NODE_22}.__contains__).compile  # type: ignore[union-attr]
    assert typescript.toolchain({"tsx", "tsc"}.__contains__).needs == ("tsx",)  # type: ignore[union-attr]
    assert table.BY_NAME["c"].toolchain({"cc"}.__contains__).compile[0] == "cc"  # type: ignore[union-attr]
    assert table.BY_NAME["java"].toolchain({"java"}.__contains__) is None  # a JRE is not enough


def test_probe_output_is_filtered_to_the_table() -> None:
    argv = table.probe_argv()
    assert argv[:2] == ["sh", "-c"] and "gcc" in argv and table.NODE_22 not in argv
    printed = "python3\ngcc\n/bin/evil\nnode>=22\nnot-asked\n"
    assert table.present_binaries(printed) == {"python3", "gcc", table.NODE_22}


def _exe(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)


def test_rootfs_probe_resolves_links_inside_the_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    _exe(root / "usr/bin/python3.11")
    (root / "usr/bin/python3").symlink_to("python3.11")
    _exe(root / "usr/lib/jvm/bin/javac")
    _exe(root / "usr/lib/jvm/bin/java")
    (root / "etc/alternatives").mkdir(parents=True)
    # Absolute links as Debian's alternatives make them: resolved inside the root.
    (root / "etc/alternatives/javac").symlink_to("/usr/lib/jvm/bin/javac")
    (root / "usr/bin/javac").symlink_to("/etc/alternatives/javac")
    (root / "usr/bin/java").symlink_to("../lib/jvm/bin/java")
    (root / "bin").symlink_to("usr/bin")
    (root / "usr/bin/bash").write_text("not executable")
    # A link that escapes to the host's gcc must not count.
    (root / "usr/bin/gcc").symlink_to("/usr/bin/gcc" if os.path.exists("/usr/bin/gcc") else "/x")
    (root / "usr/bin/g++").symlink_to("../../../../../../../../usr/bin/g++")
    (root / "usr/bin/loop").symlink_to("loop")
    has = table.rootfs_has_binary(root)
    assert has("python3") and has("javac") and has("java")
    assert not has("bash") and not has("gcc") and not has("g++") and not has("loop")
    assert table.languages_in_rootfs(root) == ["python", "java"]


def test_java_class_name() -> None:
    assert java_class("public class Solution {\n public static void main(String[] a){}\n}") == (
        "Solution"
    )
    assert java_class("class A {}\nclass B { public static void main(String[] a) {} }") == "B"
    assert java_class("public final class Fin { }") == "Fin"
    assert java_class("// public class Comment\nclass X {}") == "Main"
    assert java_class("public class ../../etc {") == "Main"  # never a path


def test_build_plan_fills_paths_under_the_build_root() -> None:
    c = table.BY_NAME["c"]
    plan = build_plan(c, c.toolchains[0], "int main(){}", "ab12")
    assert plan.directory == "/tmp/.sandpit/build-ab12"
    assert plan.source == "/tmp/.sandpit/build-ab12/main.c"
    assert plan.compile[0] == "gcc" and "/tmp/.sandpit/build-ab12/main" in plan.compile
    assert plan.run == ("/tmp/.sandpit/build-ab12/main",)
    java = table.BY_NAME["java"]
    plan = build_plan(java, java.toolchains[0], "public class Hi {}", "cd34")
    assert plan.source.endswith("/Hi.java") and plan.run[-1] == "Hi"
    go = table.BY_NAME["go"]
    assert build_plan(go, go.toolchains[0], "", "ef").env["GOCACHE"] == "/tmp/.sandpit/go-cache"


def test_streamed_argv_passes_code_as_an_argument_never_in_the_script() -> None:
    python = table.BY_NAME["python"]
    assert streamed_argv(python, python.toolchains[0], "print(1)") == [
        "python3",
        "-u",
        "-c",
        "print(1)",
    ]
    c = table.BY_NAME["c"]
    hostile = '"; rm -rf / #$(reboot)`id`'
    argv = streamed_argv(c, c.toolchains[0], hostile)
    assert argv[:2] == ["sh", "-c"] and hostile not in argv[2] and hostile in argv[3:]
