"""The ``hcp-linux`` command: its entry point (launch: a served run, else the CLI), its
commands (cli), ``run``'s options (cli_args), the configs it reads (config) and the layers
it composes with a preset (compose), ``policy list|show|import`` (policy_cmd), ``run --pack``
(driver_cli), how a run ends
in-process or served (run_end, interrupt), and ``hcp-linux serve`` with its client and wire
(serve, serve_client, serve_wire).

May import: anything of the package; nothing imports it but ``hcp_linux.__main__``. The
served path (launch → serve_client) imports only what it needs: keep this file free of imports.
"""
