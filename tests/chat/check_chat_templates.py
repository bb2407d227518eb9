"""Renders every chat template (the tokenizer_config.json files found under the given folders, and
the *.jinja files of tests/data/chat_templates wrapped in a config with <s> / </s> special tokens)
on every conversation of tests/data/chat_templates/cases with Jinja2 (jinja_reference.py) and with
tpucore's renderer (chat_render), and checks the outputs are equal byte for byte. A conversation
the template rejects (raise_exception or a Jinja error) must be rejected by both.
    check_chat_templates.py CHAT_RENDER DATA_DIR [CONFIG_DIR...] [--min-configs N]"""
import glob
import json
import os
import subprocess
import sys
import tempfile

import jinja_reference


def main():
    args = sys.argv[1:]
    min_configs = 0
    if "--min-configs" in args:
        k = args.index("--min-configs")
        min_configs = int(args[k + 1])
        del args[k:k + 2]
    exe, data = args[0], args[1]
    configs = []
    for d in args[2:]:
        configs += sorted(glob.glob(os.path.join(d, "**", "tokenizer_config.json"), recursive=True))
    configs = [c for c in configs if json.load(open(c, encoding="utf-8")).get("chat_template")]
    tmp = tempfile.mkdtemp(prefix="chat_templates_")
    for j in sorted(glob.glob(os.path.join(data, "*.jinja"))):
        cfg = {"chat_template": open(j, encoding="utf-8").read(), "bos_token": "<s>", "eos_token": "</s>"}
        path = os.path.join(tmp, os.path.basename(j) + ".json")
        json.dump(cfg, open(path, "w", encoding="utf-8"))
        configs.append(path)
    cases = sorted(glob.glob(os.path.join(data, "cases", "*.json")))
    n_real = len(configs) - len(glob.glob(os.path.join(data, "*.jinja")))
    if n_real < min_configs:
        print(f"found {n_real} tokenizer_config.json files with a chat template, expected at least {min_configs}")
        return 1
    passed = failed = errors_both = 0
    for cfg_path in configs:
        cfg = json.load(open(cfg_path, encoding="utf-8"))
        for case_path in cases:
            case = json.load(open(case_path, encoding="utf-8"))
            try:
                want, want_err = jinja_reference.render(cfg, case), None
            except Exception as e:  # the template rejected the conversation
                want, want_err = None, f"{type(e).__name__}: {e}"
            r = subprocess.run([exe, cfg_path, case_path], capture_output=True)
            got = r.stdout.decode("utf-8", errors="replace")
            label = f"{os.path.relpath(cfg_path)} x {os.path.basename(case_path)}"
            if want_err is not None:
                if r.returncode == 3:
                    passed += 1
                    errors_both += 1
                else:
                    failed += 1
                    print(f"FAIL {label}: Jinja2 raised ({want_err}) but tpucore rendered:\n{got!r}")
            elif r.returncode != 0 or got != want:
                failed += 1
                print(f"FAIL {label}:\n  jinja2 : {want!r}\n  tpucore: {got!r} (exit {r.returncode})")
            else:
                passed += 1
    print(f"{len(configs)} templates x {len(cases)} conversations ({errors_both} rejected by both)")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed or passed == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
