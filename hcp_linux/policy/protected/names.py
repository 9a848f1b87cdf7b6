"""The names protected in every writable root (hcp_linux.policy.protected), each with why.

Apart from the code that protects them so that all of it reads them: the lookup before a run
and the sweep (the package), the search below the top level (.search) and the after-run
search (.after). Only data.
"""
from __future__ import annotations

#: Each protected name, relative to a writable root's top level, and why it is there.
NAMES: dict[str, str] = {
    ".git/hooks": "git runs these on the host (pre-commit, post-checkout...)",
    ".git/config": "core.fsmonitor, core.hooksPath, core.pager, aliases and filter drivers: "
                   "commands git runs on the user's next git status",
    ".git/commondir": "names the directory git reads the repository's config and hooks "
                      "from (a worktree's common dir): a redirect around .git/config",
    ".git/config.worktree": "a worktree's own config (extensions.worktreeConfig): the same "
                            "commands as .git/config",
    ".git": "as a file (a gitdir pointer) it names the repository git uses, with its "
            "hooks and config; as a directory only .git/hooks and .git/config are protected",
    ".gitmodules": "submodule URLs and update commands git runs on submodule update",
    ".husky": "git hooks husky runs (core.hooksPath = .husky/_ runs .husky/pre-commit...)",
    ".pre-commit-config.yaml": "pre-commit's hooks, run by git on the user's next commit "
                               "(a local hook's entry is any command)",
    "lefthook.yml": "lefthook's hooks, run by git on the user's next commit",
    ".lefthook.yml": "lefthook's hooks, run by git on the user's next commit",
    ".gitconfig": "git's user config, when a writable root is a home directory",
    ".bashrc": "sourced by bash", ".bash_profile": "sourced by bash",
    ".bash_login": "sourced by bash", ".bash_logout": "sourced by bash",
    ".profile": "sourced by sh and bash", ".zshrc": "sourced by zsh",
    ".zshenv": "sourced by zsh", ".zprofile": "sourced by zsh", ".zlogin": "sourced by zsh",
    ".zlogout": "sourced by zsh",
    ".envrc": "run by direnv on entering the directory",
    ".vscode": "tasks, launch configurations and settings VS Code runs",
    ".idea": "run configurations and settings of JetBrains IDEs",
    ".mcp.json": "MCP servers an agent starts (commands)",
    ".claude": "an agent's settings: hooks and permissions",
    ".cursor": "an editor agent's rules, settings and MCP servers",
    ".ssh": "authorized_keys, config (ProxyCommand) of a home directory",
    # a home directory's own, run without the user choosing to run the project: at the next
    # git command anywhere, shell, login or editor start
    ".config/git/config": "git's user config where XDG puts it: the same commands as "
                          ".gitconfig, on any repository's next git status",
    ".config/fish/config.fish": "sourced by fish", ".config/fish/conf.d": "each file "
                                                    "sourced by fish",
    ".config/systemd/user": "user units systemd starts (at the next login, or on a timer)",
    ".config/environment.d": "variables systemd sets for the user's session (PATH, "
                             "LD_PRELOAD)",
    ".config/autostart": "programs a desktop session starts at the next login",
    ".xsessionrc": "sourced by the X session at login", ".xprofile": "sourced by display "
                                                                     "managers at login",
    ".local/bin": "on PATH, before /usr/bin in Debian's .profile: a planted git or ls "
                  "runs at the user's next command",
    ".config/direnv": "direnvrc and lib/*.sh, sourced by direnv in every directory",
    ".vimrc": "run by vim at every start", ".vim": "plugins vim loads at every start",
    ".config/nvim": "init.lua and plugins, run by nvim at every start",
    ".emacs": "run by emacs at every start", ".emacs.d": "init.el, run by emacs at every start",
    # the agents' and tools' own settings in a home, that name commands they run (or what
    # their sandbox lets through) at the user's next session of that tool, in any project
    ".codex": "Codex CLI's config.toml: sandbox mode, approval policy, MCP servers (commands)",
    ".gemini": "Gemini CLI's settings.json: MCP servers (commands), tools it runs unasked",
    ".config/opencode": "opencode's config: MCP servers (commands), permissions",
    ".srt-settings.json": "sandbox-runtime's settings: what its sandbox lets a command reach",
    ".kube/config": "exec credential plugins: the command kubectl runs on every call",
    ".aws/config": "credential_process: the command the AWS CLI and SDKs run for "
                   "credentials",
    ".docker/config.json": "credHelpers: the docker-credential-* program docker runs",
    ".gnupg/gpg-agent.conf": "pinentry-program: what gpg-agent runs for a passphrase (a "
                             "signed git commit)",
}

#: Names that mean something only at a root's top, where the root is a home directory: a
#: home's own settings (git reads the user's ~/.config/git/config, never a project's
#: sub/.config/git/config). The search below the top level does not look for them.
TOP_ONLY = frozenset({
    ".config/git/config", ".config/fish/config.fish", ".config/fish/conf.d",
    ".config/systemd/user", ".config/environment.d", ".config/autostart", ".xsessionrc",
    ".xprofile", ".local/bin", ".config/direnv", ".vimrc", ".vim", ".config/nvim", ".emacs",
    ".emacs.d", ".codex", ".gemini", ".config/opencode", ".srt-settings.json", ".kube/config",
    ".aws/config", ".docker/config.json", ".gnupg/gpg-agent.conf"})

#: A name protected only when it is not a directory (its protected children are listed).
FILE_ONLY = frozenset({".git"})

#: What protects a git directory, relative to it: the repository's own ``.git``, a
#: submodule's under ``.git/modules/``, a linked worktree's under ``.git/worktrees/`` (each
#: with the key of :data:`NAMES` that names it, for ``allow_write_protected``). git runs a
#: submodule's hooks and its config's commands (``core.fsmonitor`` on the superproject's
#: ``git status``), and reads a worktree's ``commondir``: a redirect to a planted repository.
GIT_DIR_NAMES = {"hooks": ".git/hooks", "config": ".git/config",
                  "commondir": ".git/commondir", "config.worktree": ".git/config.worktree"}
