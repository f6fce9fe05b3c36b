"""``pyggml-codec fetch``: the codec of a published S2 Pro GGUF, downloading only its bytes.

    pyggml-codec fetch                                   (rodrigomt/s2-pro-gguf, s2-pro-f16.gguf)
    pyggml-codec fetch --file s2-pro-q8_0.gguf -o codec.gguf
    pyggml-codec fetch https://host/path/s2-pro-f16.gguf

Prints the written file's path on stdout.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..hub.fetch import DEFAULT_FILE, DEFAULT_REPO, cache_dir, default_output, fetch
from .codec_commands import CliError
from .progress import bars_for

DESCRIPTION = ("Download the codec of a merged S2 Pro GGUF (the C++ engine's file: language model + codec) "
               "and write it as a codec-only fish-speech-codec GGUF. Only the codec's bytes are downloaded "
               "(about 0.8 GB of the 2.6-9.9 GB files), over HTTP range requests; an interrupted fetch resumes. "
               "Honours HF_ENDPOINT, HF_TOKEN (or the huggingface-cli login), HF_HOME and HF_HUB_OFFLINE.")


def register_cli(sub, common: argparse.ArgumentParser, progress: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``fetch`` subcommand to ``sub`` (the CLI's subparsers); ``common`` and ``progress``
    are the shared parent parsers (-q/-v, --progress/--no-progress)."""
    p = sub.add_parser("fetch", parents=[common, progress], help="download a real model's codec (only its bytes)",
                       description=DESCRIPTION)
    p.add_argument("url", nargs="?", default=None, metavar="URL",
                   help="http(s) URL of a merged GGUF (instead of --repo/--file)")
    p.add_argument("--repo", default=None, help=f"Hugging Face Hub repository (default {DEFAULT_REPO})")
    p.add_argument("--file", dest="filename", default=None, metavar="FILE",
                   help=f"file in the repository (default {DEFAULT_FILE})")
    p.add_argument("--revision", default="main", help="branch, tag or commit (default main)")
    p.add_argument("-o", "--output", type=Path, default=None,
                   help=f"codec GGUF to write (default: in the cache, {default_output()})")
    p.add_argument("--cache-dir", type=Path, default=None,
                   help=f"cache folder for the default output (default $PYGGML_CODEC_CACHE or "
                        f"$HF_HOME/pyggml_codec: {cache_dir()})")
    p.add_argument("--endpoint", default=None, help="Hub endpoint or mirror (default $HF_ENDPOINT or https://huggingface.co)")
    p.add_argument("--token", default=None, help="Hub token (default $HF_TOKEN or the saved huggingface-cli login)")
    p.add_argument("--no-token", action="store_true", help="send no token")
    p.add_argument("--force", action="store_true", help="fetch again even if the output exists")
    p.add_argument("--no-verify", action="store_true", help="skip the final load of the written file on the CPU")
    p.add_argument("--retries", type=int, default=3, help="retries of a failed request, each resuming (default 3)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds without data before a request fails (default 60)")
    p.set_defaults(func=cmd_fetch)
    return p


def cmd_fetch(args: argparse.Namespace) -> int:
    if args.url is not None and (args.repo or args.filename):
        raise CliError("give either URL or --repo/--file, not both", status=2)
    if args.token is not None and args.no_token:
        raise CliError("--token and --no-token exclude each other", status=2)
    if args.retries < 0 or not args.timeout > 0:
        raise CliError("--retries must be >= 0 and --timeout > 0", status=2)
    if args.output is not None and args.output.exists() and not args.force:
        raise CliError(f"{args.output} exists (use --force to overwrite)")
    cached = args.output is None and not args.force and default_output(
        args.url, args.repo or DEFAULT_REPO, args.filename or DEFAULT_FILE, args.revision, args.cache_dir).exists()
    if cached and not args.quiet:
        print("pyggml-codec: already fetched (use --force to fetch again)", file=sys.stderr)
    with bars_for(args) as bars:
        out = fetch(args.url, repo=args.repo, filename=args.filename, revision=args.revision, output=args.output,
                    cache=args.cache_dir, token=False if args.no_token else args.token, endpoint=args.endpoint,
                    force=args.force, verify=not args.no_verify, retries=args.retries, timeout=args.timeout,
                    progress=bars)
    if not args.quiet:
        print(out)
    return 0
