"""The account key of an Azure File share, read from Azure Key Vault with the Azure CLI, as NNI does.

The key goes only into the experiment's Secret, at submission
(render.with_secrets): never into a rendered object, a recorded one
(trials/<id>/kubernetes.yaml) or a message.
"""
from __future__ import annotations

import subprocess

from trialkit.errors import UserError
from trialkit.platforms.kubernetes.config import AzureStorage

AZ = "az"  # the Azure CLI, signed in with `az login`
TIMEOUT_SECONDS = 60.0
WHERE = "trainingService.storage.keyVaultKey"


def key_command(storage: AzureStorage) -> list:
    return [AZ, "keyvault", "secret", "show", "--vault-name", storage.vault, "--name", storage.key_name,
            "--query", "value", "--output", "tsv"]


def account_key(storage: AzureStorage) -> str:
    """The storage account's key from the vault; UserError (one line, no key in it) when it cannot be read."""
    fix = "sign in with az login, and check keyVaultName and keyVaultKey"
    try:
        done = subprocess.run(key_command(storage), capture_output=True, text=True, timeout=TIMEOUT_SECONDS)
    except FileNotFoundError:
        raise UserError("the Azure CLI (az) is not installed, and the share's key is in Azure Key Vault", WHERE,
                        "install the Azure CLI and sign in with az login") from None
    except subprocess.TimeoutExpired:
        raise UserError(f"az did not answer within {TIMEOUT_SECONDS:g} s", WHERE, fix) from None
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise UserError(f"az cannot read secret {storage.key_name!r} of key vault {storage.vault!r}: {said}", WHERE,
                        fix)
    key = done.stdout.strip()
    if not key:
        raise UserError(f"secret {storage.key_name!r} of key vault {storage.vault!r} is empty", WHERE, fix)
    return key
