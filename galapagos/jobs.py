"""The `galapagos launch` command: check the Galapagos command it is to run (its options, paths and config), then
write the job script for the scheduler (launch.scripts), save its settings and submit it with any follow-ups; and
`galapagos setup`, the Python environment a site profile documents."""
from __future__ import annotations

import contextlib
import io
import shlex
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from galapagos.errors import UsageError
from galapagos.launch.scripts import (OPTION_KEYS, apply_site, build_request, check_chain, is_active, load_settings,
                                      load_site, next_script, parse_env, render, save_settings, site_options, submit,
                                      write_job)
from galapagos.launch.scripts.request import PINNED_CONFIG, job_folder
from galapagos.launch.scripts.stage import environment, pack_environment
from galapagos.parser import build_parser

JOB_COMMANDS = ("evolve", "ensemble", "design")
PATH_OPTIONS = ("--data", "--out", "--config", "--run", "--from")  # --from: ensemble's old spelling of --run


def parse_command(tokens: list[str]):
    """argparse's verdict on a galapagos command, as a UsageError instead of an exit."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return build_parser().parse_args(tokens)
    except SystemExit:
        why = err.getvalue().strip().splitlines()
        raise UsageError(f"the command after --: {why[-1] if why else 'not a valid galapagos command'}") from None


def resolve_command(tokens: list[str], cwd: Path) -> tuple[tuple[str, ...], Path]:
    """The galapagos command after `--`, checked, with every path made absolute; and its run directory."""
    tokens = list(tokens)
    if tokens[:1] == ["--"]:
        tokens = tokens[1:]
    if tokens and Path(tokens[0]).name == "galapagos":
        tokens = tokens[1:]
    if not tokens:
        raise UsageError("no command: put the Galapagos command after --, e.g. "
                         "-- galapagos evolve --data data.h5 --out runs/big --evaluations 5000")
    if tokens[0] not in JOB_COMMANDS:
        raise UsageError(f"the command after -- must be a Galapagos job ({', '.join(JOB_COMMANDS)}), not "
                         f"{shlex.join(tokens[:2])!r}")
    resolved, i = [tokens[0]], 1
    while i < len(tokens):
        name, eq, value = tokens[i].partition("=")
        if name in PATH_OPTIONS and eq:
            resolved.append(f"{name}={(cwd / value).absolute()}")
        elif name in PATH_OPTIONS and i + 1 < len(tokens):
            resolved += [name, str((cwd / tokens[i + 1]).absolute())]
            i += 1
        else:
            resolved.append(tokens[i])
        i += 1
    parse_command(resolved)
    paths = _path_values(resolved)
    if "--out" not in paths:
        raise UsageError(f"the command after -- has no --out: galapagos {resolved[0]} needs a run directory")
    out = Path(paths["--out"])
    for option, value in paths.items():
        if option != "--out" and not Path(value).exists():
            raise UsageError(f"{option} {value}: no such file or directory")
    return tuple(resolved), out


def _path_values(tokens: list[str] | tuple[str, ...]) -> dict[str, str]:
    values, i = {}, 0
    while i < len(tokens):
        name, eq, value = tokens[i].partition("=")
        if name in PATH_OPTIONS:
            values[name] = value if eq else tokens[i + 1]
            i += 0 if eq else 1
        i += 1
    return values


def without_option(tokens: tuple[str, ...], option: str) -> list[str]:
    out, skip = [], False
    for t in tokens:
        if skip:
            skip = False
        elif t == option:
            skip = True
        elif not t.startswith(option + "="):
            out.append(t)
    return out


def pin_config(command: tuple[str, ...], out: Path, job_dir: Path) -> tuple[str, ...]:
    """evolve: check the config now, write the resolved file beside the script and run the job with it."""
    from galapagos.config import evolve_config
    from galapagos.options import EvolveOptions
    from galapagos.store.rundir import RunDir

    args = parse_command(list(command))
    if args.command != "evolve" or args.resume:
        return command
    config = evolve_config(EvolveOptions.from_args(args))  # bad keys and values fail here, before anything is written
    RunDir.check(out, resume=False)
    job_dir.mkdir(parents=True, exist_ok=True)
    pinned = job_dir / PINNED_CONFIG
    pinned.write_text(config.dumps())
    return (*without_option(command, "--config"), "--config", str(pinned))


def resume_command(command: tuple[str, ...]) -> tuple[str, ...]:
    """The follow-up of a job: the same command continuing its run (--resume, the run's own config)."""
    tokens = without_option(command, "--config")
    if "--resume" not in tokens:
        tokens.append("--resume")
    try:
        parse_command(tokens)
    except UsageError as exc:
        raise UsageError(f"galapagos {tokens[0]} cannot be resumed: {exc}") from None
    return tuple(tokens)


def default_program() -> str:
    """The galapagos of this installation, by absolute path, so the job runs what was checked here."""
    entry = Path(sys.executable).parent / "galapagos"
    return str(entry) if entry.exists() else f"{sys.executable} -m galapagos.cli"


def resumed_run(args: Any) -> str | None:
    """The run whose follow-up job `launch --resume --run DIR` writes (`--resume DIR`, the old spelling, too)."""
    old = args.resume if isinstance(args.resume, str) else None
    if args.run and old and args.run != old:
        raise UsageError(f"--resume {old} and --run {args.run}: give the run once, as --resume --run DIR")
    if args.run and not args.resume:
        raise UsageError(f"--run {args.run}: launch writes the follow-up job of a run with --resume --run DIR "
                         "(a new job takes its command after --)")
    if args.resume and not (args.run or old):
        raise UsageError("--resume: which run? give --resume --run DIR")
    return args.run or old


def launch(args: Any, argv: list[str], say: Callable[[str], None]) -> list[dict]:
    """Check everything, write the script (and its settings), then submit it and any chained follow-ups; `say`
    hears each script written, each job submitted and each dependency found, as it happens. Returns each job's
    script and (submitted) id."""
    site = load_site(args.site) if args.site else {}
    resume = resumed_run(args)
    given = {k: getattr(args, k) for k in OPTION_KEYS if getattr(args, k, None) is not None}
    env = parse_env(args.env or [])
    tokens = args.job_command[1:] if args.job_command[:1] == ["--"] else args.job_command
    if args.chain and not args.submit:
        raise UsageError("--chain needs --submit: follow-up jobs wait on the id of the job before them")
    if args.chain < 0:
        raise UsageError(f"--chain {args.chain}: must be 0 or more")
    if resume:
        if tokens:
            raise UsageError(f"--resume --run {resume} writes the follow-up of that run: give no command after --")
        out = Path(resume).absolute()
        saved = load_settings(out)
        if not saved.get("stop_before_explicit"):  # derived from the old wall time: derive it again from the new
            saved.pop("stop_before", None)
        kept = (*OPTION_KEYS, "workdir", "modules", "route", "site")
        opts = {**site_options(site), **{k: v for k, v in saved.items() if k in kept}, **given}
        env = {**site.get("env", {}), **saved.get("env", {}), **env}
        directives = [*saved.get("directives", site.get("directives", [])), *(args.directives or [])]
        command = resume_command(tuple(saved["command"]))
        after = args.after
        last = next((j["id"] for j in reversed(saved.get("jobs", [])) if "id" in j), None)
        if after is None and last and is_active(opts["scheduler"], last):
            after = last
            say(f"waits for job {last}, which is still queued or running")
    else:
        opts = {**site_options(site), **given}
        env = {**site.get("env", {}), **env}
        directives = [*site.get("directives", []), *(args.directives or [])]
        command, out = resolve_command(tokens, Path.cwd())
        after = args.after
    opts["env"], opts["directives"] = env, directives
    opts = apply_site(site, opts, given) if site else opts  # the MPI route, QOS queues, storage's directive
    opts["site"] = site.get("path") or opts.get("site")
    check_chain(site, opts, args.chain)
    opts["program"] = opts.get("program") or default_program()
    generated_by = shlex.join(["galapagos", *argv])
    req = build_request(opts, command, out, site=site, after=after, generated_by=generated_by,
                        script=Path(args.script).absolute() if args.script else job_folder(out) / "check.sh")
    render(req)  # scheduler-specific checks, before anything is written
    if req.stage:  # the environment the compute nodes copy to their local storage (launch/scripts/stage.py)
        tar = pack_environment(environment(), job_folder(out))
        say(f"environment packed for staging: {tar} ({tar.stat().st_size / 2**20:.0f} MiB)")
        req = replace(req, stage_env=tar, stage_data=_path_values(command).get("--data"))
    if args.script and not req.script.parent.is_dir():
        raise UsageError(f"--script {args.script}: directory {req.script.parent} does not exist")
    if not resume:
        command = pin_config(command, out, job_folder(out))
    req = replace(req, command=command, script=req.script if args.script else next_script(job_folder(out),
                                                                                         req.scheduler))
    jobs = [req]
    for k in range(args.chain):
        jobs.append(replace(req, command=resume_command(req.command), after=None,
                            script=req.script.with_name(f"{req.script.stem}-follow-{k + 1}.sh"),
                            generated_by=f"{generated_by}  (follow-up {k + 1} of --chain {args.chain})"))
    previous, written = None, []
    for job in jobs:
        if job is not req:
            job = replace(job, after=previous)
        write_job(job)
        say(f"script: {job.script}")
        job_id = submit(job.scheduler, job.script) if args.submit else None
        save_settings(job, job_id)
        if job_id:
            say(f"submitted: {job.scheduler} job {job_id}")
        previous = job_id
        written.append({"script": str(job.script), "scheduler": job.scheduler, "job_id": job_id})
    if req.walltime:
        say(failure_cost(req.layout.nodes, req.walltime, site))
    return written


def failure_cost(nodes: int, walltime: int, site: dict) -> str:
    """The share of the allocation node failures are expected to cost, with and without recovery
    (galapagos/flows/recovery.py expected_loss), at the node MTBF the site profile states ([machine]
    node_mtbf_hours) or the default."""
    from galapagos.flows.recovery import NODE_MTBF_HOURS, expected_loss

    mtbf = site.get("machine", {}).get("node_mtbf_hours")
    without, recovered = expected_loss(nodes, walltime, mtbf or NODE_MTBF_HOURS)
    source = "the site's [machine] node_mtbf_hours" if mtbf else "the default; a site states node_mtbf_hours"
    return (f"node failures: {nodes} node(s) for {walltime / 3600:g} h at a node MTBF of {mtbf or NODE_MTBF_HOURS:g} h "
            f"({source}) are expected to cost {without:.2%} of the allocation without recovery, {recovered:.2%} "
            "with it (restarts on the nodes that answer)")


def setup(args: Any, say: Callable[[str], None]) -> None:
    """Make the environment the site documents (workstation: a venv with torch and galapagos-nas[mpich]), or print
    the commands where they need the centre's modules (every centre profile) or --print asks for them."""
    from galapagos.launch.scripts.envsetup import SetupOptions, run_plan, runnable, setup_plan

    site = load_site(args.site)
    opts = SetupOptions(source=args.source, torch=args.torch, python=args.python,
                        system_site_packages=args.system_site_packages, pip_args=tuple(shlex.split(args.pip_args)))
    target = Path(args.dir).absolute()
    lines = setup_plan(site, target, opts)
    name = site["name"]
    if args.print_only or not runnable(site):
        where = "here" if runnable(site) else f"on a login node of {name} ({site['mpi'].get('doc', site['path'])})"
        say(f"# the Python environment for {name}, by its MPI route ({site['mpi']['route']}): run these {where}")
        for line in lines:
            say(line)
    else:
        if target.exists() and any(target.iterdir()):
            raise UsageError(f"{args.dir}: exists and is not empty; choose a new directory for the environment")
        run_plan(lines, say)
        say(f"environment ready: {target}")
    say(f"# then: source {shlex.quote(str(target / 'bin' / 'activate'))} && galapagos doctor --site {name}")
    say(f"# and:  galapagos launch --site {name} --nodes N ... -- galapagos evolve --data DATA --out RUN")
