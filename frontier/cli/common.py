"""What every task shares: loading the stack and turning Frontier errors into clean exits."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    EndpointConnectionError,
    NoCredentialsError,
    NoRegionError,
)
from invoke.exceptions import Exit

from frontier.config.schema import Settings
from frontier.errors import FrontierError, StackError
from frontier.targets import load_stack


def settings_for(stack: str | None) -> Settings:
    """Load the stack named by --stack (or $FRONTIER_STACK, else `local`)."""
    return load_stack(stack)


def pool_settings(stack: str | None, model: str | None) -> Settings:
    """The stack, or the view of one of its model pools (``--model``): its hosts, runtime and history.

    A stack that serves several models rolls one pool at a time, so it needs ``--model``.
    """
    settings = load_stack(stack)
    if model is None:
        if len(settings.pools) > 1:
            raise settings.several_models("name the pool to roll with --model")
        return settings
    try:
        return settings.for_pool(model)
    except KeyError as exc:
        raise StackError(f"--model: {exc.args[0]}") from None


def reports_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Print a FrontierError, or an AWS error a user can cause, as one line (no traceback) and exit
    non-zero."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except FrontierError as exc:
            raise Exit(f"error: {exc}", code=2) from None
        except (BotoCoreError, ClientError) as exc:
            raise Exit(f"error: {aws_error_line(exc)}", code=2) from None

    return wrapper


# What a user can do about each AWS error code: the message names the setting to fix.
_CLIENT_ERRORS = {
    "ExpiredToken": "the AWS session token has expired: renew the credentials (e.g. `aws sso login`)",
    "ExpiredTokenException": "the AWS session token has expired: renew the credentials (e.g. `aws sso login`)",
    "InvalidClientTokenId": "the AWS access key is not valid in this account: check AWS_ACCESS_KEY_ID / AWS_PROFILE",
    "UnrecognizedClientException": "the AWS access key is not valid: check AWS_ACCESS_KEY_ID / AWS_PROFILE",
    "SignatureDoesNotMatch": "the AWS secret key does not match the access key: check AWS_SECRET_ACCESS_KEY",
    "AccessDenied": "AWS denied {operation}: the credentials' role lacks that permission",
    "AccessDeniedException": "AWS denied {operation}: the credentials' role lacks that permission",
    "UnauthorizedOperation": "AWS denied {operation}: the credentials' role lacks that permission",
    "Throttling": "AWS throttled {operation}: retry in a minute, or lower the request rate",
    "ThrottlingException": "AWS throttled {operation}: retry in a minute, or lower the request rate",
    "RequestLimitExceeded": "AWS throttled {operation}: retry in a minute, or lower the request rate",
}


def aws_error_line(exc: BotoCoreError | ClientError) -> str:
    """One line saying what to fix for an AWS error a user can cause; AWS's own words otherwise."""
    if isinstance(exc, NoCredentialsError):
        return (
            "no AWS credentials found: set AWS_PROFILE (or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY), "
            "or run where an instance role applies"
        )
    if isinstance(exc, NoRegionError):
        return "no AWS region: set the stack's aws:region (or AWS_REGION)"
    if isinstance(exc, EndpointConnectionError):
        return f"cannot reach AWS at {exc.kwargs.get('endpoint_url', '?')}: check the region and the network"
    if isinstance(exc, ClientError):
        code = exc.response.get("Error", {}).get("Code", "")
        operation = exc.operation_name
        hint = _CLIENT_ERRORS.get(code)
        if hint:
            return f"{hint.format(operation=operation)} ({code})"
        return f"AWS refused {operation}: {code}: {exc.response.get('Error', {}).get('Message', '')}"
    return f"AWS: {exc}"
