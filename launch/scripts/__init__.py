"""Batch scripts that run one Galapagos job across a whole machine, for the scheduler it has, and their submission.

request: what a job asks for and its checks; sites: site profiles and their MPI route; body: the script every
scheduler shares; schedulers: one table entry per scheduler; submit: handing the script over; envsetup: the
commands of `galapagos setup`. Nothing here knows the galapagos command line (galapagos/jobs.py).
"""
from galapagos.launch.scripts.body import render, write_job
from galapagos.launch.scripts.request import (OPTION_KEYS, SCHEDULERS_ORDER, JobRequest, JobScriptError, Layout,
                                              build_request, check_queue_limits, default_stop_before, hms,
                                              load_settings, make_layout, next_script, parse_env, parse_walltime,
                                              save_settings)
from galapagos.launch.scripts.schedulers import SCHEDULERS, Scheduler, erf, smt_level
from galapagos.launch.scripts.sites import (MACHINE_KEYS, QUEUE_KEYS, SITE_KEYS, apply_site, bundled_sites, check_chain,
                                            find_site, load_site, site_options)
from galapagos.launch.scripts.submit import is_active, submit

__all__ = ["MACHINE_KEYS", "OPTION_KEYS", "QUEUE_KEYS", "SCHEDULERS", "SCHEDULERS_ORDER", "SITE_KEYS", "JobRequest",
           "JobScriptError", "Layout", "Scheduler", "apply_site", "build_request", "bundled_sites", "check_chain",
           "check_queue_limits", "default_stop_before", "erf", "find_site", "hms", "is_active", "load_settings",
           "load_site", "make_layout", "next_script", "parse_env", "parse_walltime", "render", "save_settings",
           "site_options", "smt_level", "submit", "write_job"]
