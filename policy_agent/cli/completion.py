"""`npaudit completion bash|zsh`: a shell completion script generated from the argparse parser itself,
so it names every verb, option and choice the installed npaudit has (no extra dependency)."""

from __future__ import annotations

import argparse
import sys

HELP = "print a shell completion script: source <(npaudit completion bash)"


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    c = sub.add_parser("completion", help=HELP, description=HELP,
                       epilog="bash: add `source <(npaudit completion bash)` to ~/.bashrc; zsh: "
                              "`source <(npaudit completion zsh)` in ~/.zshrc (it uses zsh's bashcompinit)")
    c.add_argument("shell", choices=("bash", "zsh"))
    c.set_defaults(func=cmd_completion)


def cmd_completion(args: argparse.Namespace) -> int:
    script = bash_script(args.build_parser())  # main's, with every verb (it imports this module)
    if args.shell == "zsh":
        script = "autoload -U +X compinit && compinit\nautoload -U +X bashcompinit && bashcompinit\n" + script
    sys.stdout.write(script)
    return 0


class _Verb:
    """What completion needs of one (sub)parser: its sub-verbs, words for its positionals, its options,
    which options take a value, and their choices."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.subs: dict[str, argparse.ArgumentParser] = {}
        self.words: list[str] = []
        self.options: list[str] = []
        self.valued: list[str] = []
        self.choices: dict[str, list[str]] = {}
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                self.subs.update(action.choices)
            elif not action.option_strings:
                self.words += [str(c) for c in action.choices or ()]
            else:
                self.options += [o for o in action.option_strings if o.startswith("--") or len(o) == 2]
                if action.nargs != 0:
                    self.valued += action.option_strings
                    for option in action.option_strings:
                        self.choices[option] = [str(c) for c in action.choices or ()]


def _case(name: str, arms: dict[str, str]) -> str:
    body = "".join(f"        '{key}') echo '{value}' ;;\n" for key, value in arms.items() if value)
    return f"_npaudit_{name}() {{\n    case \"$1\" in\n{body}    esac\n}}\n"


def bash_script(parser: argparse.ArgumentParser) -> str:
    """The bash completion script for `parser`: one case table per kind of word, keyed by the verb path
    (`syslog_status`), and one function that walks the words typed so far."""
    subs: dict[str, str] = {}
    words: dict[str, str] = {}
    options: dict[str, str] = {}
    valued: dict[str, str] = {}
    choices: dict[str, str] = {}
    todo = [("", parser)]
    while todo:
        path, current = todo.pop()
        verb = _Verb(current)
        subs[path] = " ".join(verb.subs)
        words[path] = " ".join([*verb.subs, *verb.words])
        options[path] = " ".join(verb.options)
        valued[path] = " ".join(verb.valued)
        for option, values in verb.choices.items():
            choices[f"{path}:{option}"] = " ".join(values)
        todo += [(f"{path}_{name}" if path else name, p) for name, p in verb.subs.items()]
    return "".join([
        "# npaudit completion for bash (generated from npaudit's own parser)\n",
        _case("subs", subs), _case("words", words), _case("options", options), _case("valued", valued),
        _case("choices", choices), _WALK])


_WALK = r'''_npaudit() {
    local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]}
    local path="" skip=0 i w
    for ((i = 1; i < COMP_CWORD; i++)); do
        w=${COMP_WORDS[i]}
        if ((skip)); then skip=0; continue; fi
        case "$w" in
            --*=*) continue ;;
            -*) [[ " $(_npaudit_valued "$path") " == *" $w "* ]] && skip=1; continue ;;
        esac
        [[ " $(_npaudit_subs "$path") " == *" $w "* ]] && path=${path:+${path}_}$w
    done
    if [[ $prev == -* && " $(_npaudit_valued "$path") " == *" $prev "* ]]; then
        local values; values=$(_npaudit_choices "$path:$prev")
        if [[ -n $values ]]; then
            mapfile -t COMPREPLY < <(compgen -W "$values" -- "$cur")
        else
            mapfile -t COMPREPLY < <(compgen -f -- "$cur")
        fi
        return 0
    fi
    if [[ $cur == -* ]]; then
        mapfile -t COMPREPLY < <(compgen -W "$(_npaudit_options "$path")" -- "$cur")
        return 0
    fi
    local next; next=$(_npaudit_words "$path")
    if [[ -n $next ]]; then
        mapfile -t COMPREPLY < <(compgen -W "$next" -- "$cur")
    else
        mapfile -t COMPREPLY < <(compgen -f -- "$cur")
    fi
    return 0
}
complete -o filenames -F _npaudit npaudit
'''
