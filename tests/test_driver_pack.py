"""Pack manifests (HCP §10.6 wrap.*): parsing, HCP defaults, and errors that name the field."""
from __future__ import annotations

import json
import os

import pytest

from hcp_linux.errors import PolicyError
from hcp_linux.policy.pack import (DEFAULT_FILE_FLAGS, EPHEMERAL, NONE, WORKSPACE, Pack, PackError,
                            WorkspaceSpec, load_pack)


def write(tmp_path, text: str, name: str = "pack.toml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_toml_manifest_with_hcp_defaults(tmp_path):
    pack = load_pack(write(tmp_path, '[wrap]\nbin = "sh"\n'))
    assert pack.root == os.path.realpath(tmp_path)
    assert pack.bins == ("sh",)
    assert dict(pack.agent_env) == {}
    # HCP §10.6 table: mode none, no home_env, the five default file flags.
    assert pack.workspace == WorkspaceSpec(NONE, (), DEFAULT_FILE_FLAGS)
    assert DEFAULT_FILE_FLAGS == ("--file", "--json-file", "--output", "-o", "--env-file")
    assert pack.key == tmp_path.name


def test_json_manifest_full(tmp_path):
    data = {"name": "gh", "tools": [{"name": "x"}],  # other HCP keys are left alone
            "wrap": {"bin": ["gh", "bin/helper", "/usr/bin/env"],
                     "agent_env": {"GH_HOST": "github.com"},
                     "workspace": {"mode": "workspace", "file_flags": ["--input", "-f"]}}}
    pack = load_pack(write(tmp_path, json.dumps(data), "pack.json"))
    root = os.path.realpath(tmp_path)
    assert pack.bins == ("gh", os.path.join(root, "bin/helper"), "/usr/bin/env")
    assert dict(pack.agent_env) == {"GH_HOST": "github.com"}
    assert pack.workspace.mode == WORKSPACE
    assert pack.workspace.home_env == ("HOME",)  # the workspace-mode default
    assert pack.workspace.file_flags == ("--input", "-f")  # replaces the default list
    assert pack.key == "gh"


@pytest.mark.parametrize("mode,home", [(NONE, ()), (EPHEMERAL, ()), (WORKSPACE, ("HOME",))])
def test_home_env_default_depends_on_mode(tmp_path, mode, home):
    pack = load_pack(write(tmp_path, f'[wrap]\nbin = "sh"\nworkspace = {{ mode = "{mode}" }}\n'))
    assert pack.workspace.home_env == home


def test_explicit_home_env_and_empty_file_flags(tmp_path):
    pack = load_pack(write(tmp_path, '[wrap]\nbin = "sh"\n[wrap.workspace]\nmode = "ephemeral"\n'
                                     'home_env = ["HOME", "XDG_CONFIG_HOME"]\nfile_flags = []\n'))
    assert pack.workspace.home_env == ("HOME", "XDG_CONFIG_HOME")
    assert pack.workspace.file_flags == ()


BAD = [
    # (manifest body, text the one error must contain)
    ('[wrap]\nbin = 3\n', "wrap.bin: expected a string or a list of strings, got an integer 3"),
    ('[wrap]\nbin = ""\n', "wrap.bin: expected a bin name or path, got an empty string"),
    ('[wrap]\nbin = []\n', "wrap.bin: expected at least one bin, got an empty list"),
    ('[wrap]\nbin = ["sh", 1]\n', "wrap.bin[1]: expected a string, got an integer 1"),
    ('[wrap]\nbin = ["sh", "  "]\n', "wrap.bin[1]: expected a bin name or path"),
    ('[wrap]\nbin = ["sh", "sh"]\n', "wrap.bin: duplicate entry 'sh'"),
    ('[wrap]\nbin = "../outside"\n', "wrap.bin: '../outside' points outside the pack root"),
    ('wrap = "sh"\n', "wrap: expected a table, got a string"),
    ('name = "x"\n', "wrap: missing"),
    ('[wrap]\nagent_env = {}\n', "wrap.bin: missing"),
    ('name = 5\n[wrap]\nbin = "sh"\n', "name: expected a non-empty string"),
    ('[wrap]\nbin = "sh"\nagentEnv = {}\n', "wrap: unknown key 'agentEnv' (did you mean 'agent_env'? expected: bin, agent_env, workspace)"),
    ('[wrap]\nbin = "sh"\nworkspace = { file_flag = [] }\n', "did you mean 'file_flags'?"),
    ('[wrap]\nbin = "sh"\nexecDriver = "vm"\n', "packs must not name a driver"),
    ('[wrap]\nbin = "sh"\nmounts = { data = ["/srv/data"] }\n', "wrap.mounts: names the host path '/srv/data'"),
    ('[wrap]\nbin = "sh"\ndriver = "microvm"\n', "packs must not name a driver"),
    ('[wrap]\nbin = "sh"\nagent_env = ["A=b"]\n', "wrap.agent_env: expected a table"),
    ('[wrap]\nbin = "sh"\nagent_env = { TOKEN = 5 }\n', "wrap.agent_env.TOKEN: expected a string, got an integer 5"),
    ('[wrap]\nbin = "sh"\nagent_env = { "A-B" = "x" }\n', "wrap.agent_env: invalid variable name 'A-B'"),
    ('[wrap]\nbin = "sh"\nagent_env = { LD_PRELOAD = "/x.so" }\n', 'wrap.agent_env: variable "LD_PRELOAD" not allowed (injects code)'),
    ('[wrap]\nbin = "sh"\nagent_env = { HCP_SANDBOX = "native-local" }\n', 'variable "HCP_SANDBOX" not allowed (is set by the sandbox)'),
    ('[wrap]\nbin = "sh"\nworkspace = "ephemeral"\n', "wrap.workspace: expected a table, got a string"),
    ('[wrap]\nbin = "sh"\nworkspace = { mode = "persistent" }\n', "wrap.workspace.mode: expected one of none, ephemeral, workspace, got a string 'persistent'"),
    ('[wrap]\nbin = "sh"\nworkspace = { mode = 1 }\n', "wrap.workspace.mode: expected one of none, ephemeral, workspace, got an integer 1"),
    ('[wrap]\nbin = "sh"\nworkspace = { mode = "none", root = "/srv" }\n', "wrap.workspace.root: names the host path '/srv'"),
    ('[wrap]\nbin = "sh"\nworkspace = { file_flags = "--file" }\n', "wrap.workspace.file_flags: expected a list of strings, got a string '--file'"),
    ('[wrap]\nbin = "sh"\nworkspace = { file_flags = ["--file", "--file"] }\n', "wrap.workspace.file_flags: duplicate entry '--file'"),
    ('[wrap]\nbin = "sh"\nworkspace = { file_flags = ["file"] }\n', "wrap.workspace.file_flags: 'file' is not a flag"),
    ('[wrap]\nbin = "sh"\nworkspace = { file_flags = ["--out=x"] }\n', "'--out=x' is not a flag"),
    ('[wrap]\nbin = "sh"\nworkspace = { home_env = ["HOME", "HOME"] }\n', "wrap.workspace.home_env: duplicate entry 'HOME'"),
    ('[wrap]\nbin = "sh"\nworkspace = { home_env = [true] }\n', "wrap.workspace.home_env[0]: expected a string, got a boolean"),
    ('[wrap]\nbin = "sh"\nworkspace = { home_env = ["PATH"] }\n', 'home_env: variable "PATH" not allowed'),
    ('[wrap]\nbin = "sh"\nworkspace = { home_env = ["LD_LIBRARY_PATH"] }\n', 'home_env: variable "LD_LIBRARY_PATH" not allowed'),
    ('[wrap]\nbin = "sh"\nagent_env = { HOME = "/x" }\nworkspace = { mode = "workspace" }\n',
     "wrap.agent_env: HOME is also in wrap.workspace.home_env"),
]


@pytest.mark.parametrize("body,expected", BAD, ids=[e for _, e in BAD])
def test_malformed_manifest_names_field(tmp_path, body, expected):
    path = write(tmp_path, body)
    with pytest.raises(PackError) as info:
        load_pack(path)
    msg = str(info.value)
    assert expected in msg
    assert msg.startswith(f"pack {path}: ")  # names the manifest too
    assert info.value.exit_code == 125
    assert "\n" not in msg


def test_malformed_syntax_and_files(tmp_path):
    with pytest.raises(PackError, match="malformed TOML"):
        load_pack(write(tmp_path, "[wrap\n"))
    with pytest.raises(PackError, match="malformed JSON"):
        load_pack(write(tmp_path, "{", "pack.json"))
    with pytest.raises(PackError, match="expected a table at the top level, got a list"):
        load_pack(write(tmp_path, "[1]", "pack.json"))
    with pytest.raises(PackError, match="expected a .json or .toml manifest"):
        load_pack(write(tmp_path, "", "pack.yaml"))
    with pytest.raises(PackError, match="No such file"):
        load_pack(str(tmp_path / "absent.toml"))
    (tmp_path / "d.toml").mkdir()
    with pytest.raises(PackError, match="is a directory"):
        load_pack(str(tmp_path / "d.toml"))
    with pytest.raises(PackError, match="not valid UTF-8"):
        p = tmp_path / "bin.toml"
        p.write_bytes(b"\xff\xfe")
        load_pack(str(p))


def test_missing_pack_root(tmp_path):
    gone = tmp_path / "gone"
    with pytest.raises(PackError, match=f"pack root {gone} does not exist"):
        load_pack(str(gone / "pack.toml"))
    with pytest.raises(PackError, match=f"pack root {gone} does not exist"):
        Pack.from_mapping({"wrap": {"bin": "sh"}}, root=gone)
    with pytest.raises(PackError, match="does not exist"):
        Pack(root=str(gone), bins=("sh",))
    with pytest.raises(PackError, match="not an absolute path"):
        Pack.from_mapping({"wrap": {"bin": "sh"}}, root="relative/dir")


def test_pack_is_immutable_and_validated_when_built_directly(tmp_path):
    pack = Pack(root=str(tmp_path), bins=["sh"], agent_env={"A": "b"})
    assert pack.bins == ("sh",)
    with pytest.raises(TypeError):
        pack.agent_env["A"] = "c"  # type: ignore[index]
    with pytest.raises(PackError, match="wrap.bin"):
        Pack(root=str(tmp_path), bins=())
    assert issubclass(PackError, PolicyError)
