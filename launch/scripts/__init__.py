"""Batch scripts that run one Galapagos job across a whole machine, for the scheduler it has, and their submission.

request: what a job asks for and its checks; body: the script every scheduler shares; schedulers: one table entry
per scheduler; submit: handing the script over. Nothing here knows the galapagos command line (galapagos/jobs.py).
"""
from galapagos.launch.scripts.body import render, write_job
from galapagos.launch.scripts.request import (MACHINE_KEYS, OPTION_KEYS, QUEUE_KEYS, SCHEDULERS_ORDER, SITE_KEYS,
                                              JobRequest, JobScriptError, Layout, build_request, check_queue_limits,
                                              default_stop_before, hms, load_settings, load_site, make_layout,
                                              next_script, parse_env, parse_walltime, save_settings)
from galapagos.launch.scripts.schedulers import SCHEDULERS, Scheduler, erf, smt_level
from galapagos.launch.scripts.submit import is_active, submit

__all__ = ["MACHINE_KEYS", "OPTION_KEYS", "QUEUE_KEYS", "SCHEDULERS", "SCHEDULERS_ORDER", "SITE_KEYS", "JobRequest",
           "JobScriptError", "Layout", "Scheduler", "build_request", "check_queue_limits", "default_stop_before", "erf",
           "hms", "is_active", "load_settings", "load_site", "make_layout", "next_script", "parse_env",
           "parse_walltime", "render", "save_settings", "smt_level", "submit", "write_job"]
