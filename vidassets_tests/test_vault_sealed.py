"""The eval vault is sealed by default, proved on a real S3-compatible server that enforces
per-credential IAM policies (moto's server in its own process with IAM enforcement on after the
setup calls): the training side's key pair (the store's) gets AccessDenied on the vault; the vault
refuses to start with no key pair of its own or with the store's, unless allowed on purpose, and
then its check warns."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import boto3
import pytest
from botocore.exceptions import ClientError

from vidassets.config import ConfigError, load_settings
from vidassets.resources import EvalVaultResource, StoreResource
from vidassets.stages.ingest import eval_vault_is_sealed
from vidassets.storage import open_object_store
from vidassets_tests.conftest import free_port

BUCKET = "vidassets-sealed"
SETUP_CALLS = 7  # the unauthenticated calls below; every later request is checked against IAM


def _policy(*resources: str, list_bucket: bool = True) -> str:
    statements = [{"Effect": "Allow", "Action": "s3:*", "Resource": list(resources)}]
    if list_bucket:
        # AWS authorises listing as s3:ListBucket; moto checks the operation's name (ListObjectsV2)
        statements.append({"Effect": "Allow", "Action": ["s3:ListBucket", "s3:ListObjectsV2"],
                           "Resource": f"arn:aws:s3:::{BUCKET}"})
    return json.dumps({"Version": "2012-10-17", "Statement": statements})


@pytest.fixture(scope="module")
def iam_s3() -> Iterator[dict]:
    port = free_port()
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": str(SETUP_CALLS), "AWS_ACCESS_KEY_ID": "setup",
           "AWS_SECRET_ACCESS_KEY": "setup"}
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            break
        except OSError:
            time.sleep(0.1)
    setup = {"endpoint_url": url, "region_name": "us-east-1", "aws_access_key_id": "setup",
             "aws_secret_access_key": "setup"}
    try:
        boto3.client("s3", **setup).create_bucket(Bucket=BUCKET)
        iam = boto3.client("iam", **setup)
        keys = {}
        for user, prefix in (("trainer", "store"), ("vault", "eval_vault")):
            iam.create_user(UserName=user)
            key = iam.create_access_key(UserName=user)["AccessKey"]
            iam.put_user_policy(UserName=user, PolicyName="scope", PolicyDocument=_policy(f"arn:aws:s3:::{BUCKET}/{prefix}/*"))
            keys[user] = (key["AccessKeyId"], key["SecretAccessKey"])
        yield {"url": url, "keys": keys}
    finally:
        server.terminate()
        server.wait(timeout=10)


@pytest.fixture()
def as_trainer(iam_s3, monkeypatch) -> dict:
    """The training side's environment: the store's key pair is the default chain's."""
    key, secret = iam_s3["keys"]["trainer"]
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(f"VIDASSETS_VAULT_{name}", raising=False)
    return iam_s3


def test_the_training_side_gets_access_denied_on_the_vault(as_trainer, monkeypatch) -> None:
    settings = load_settings(env={}, overrides={"store.uri": f"s3://{BUCKET}/store"})
    vault_root = settings.store.vault_uri()
    assert vault_root == f"s3://{BUCKET}/eval_vault" and not vault_root.startswith(settings.store.uri + "/")
    key, secret = as_trainer["keys"]["vault"]
    monkeypatch.setenv("VIDASSETS_VAULT_AWS_ACCESS_KEY_ID", key)
    monkeypatch.setenv("VIDASSETS_VAULT_AWS_SECRET_ACCESS_KEY", secret)
    vault = EvalVaultResource(root=vault_root, s3_endpoint_url=as_trainer["url"])
    assert vault.sealing() is None
    vault.tables().objects.put_bytes("eval_assets/held-out.bin", b"eval material")  # the vault side, its own pair
    store = StoreResource(root=settings.store.uri, s3_endpoint_url=as_trainer["url"])
    store.objects().put_bytes("probe.txt", b"train side")  # the store works with the training side's pair
    training_side = open_object_store(vault_root, lambda: boto3.session.Session().client("s3", endpoint_url=as_trainer["url"]))
    assert vault.tables().objects.get_bytes("eval_assets/held-out.bin") == b"eval material"
    with pytest.raises(ClientError, match="AccessDenied"):
        training_side.get_bytes("eval_assets/held-out.bin")
    assert eval_vault_is_sealed(vault).passed


def test_the_vault_refuses_the_stores_credentials_unless_allowed_and_then_warns(as_trainer, monkeypatch) -> None:
    root = f"s3://{BUCKET}/eval_vault"
    with pytest.raises(ConfigError, match="eval.vault_shared_credentials: .*no credentials of its own"):
        EvalVaultResource(root=root, s3_endpoint_url=as_trainer["url"]).tables()
    key, secret = as_trainer["keys"]["trainer"]
    monkeypatch.setenv("VIDASSETS_VAULT_AWS_ACCESS_KEY_ID", key)  # the store's own pair, handed to the vault
    monkeypatch.setenv("VIDASSETS_VAULT_AWS_SECRET_ACCESS_KEY", secret)
    with pytest.raises(ConfigError, match="the store's own access key"):
        EvalVaultResource(root=root, s3_endpoint_url=as_trainer["url"]).tables()
    shared = EvalVaultResource(root=root, s3_endpoint_url=as_trainer["url"], shared_credentials=True)
    shared.tables()  # allowed on purpose ...
    check = eval_vault_is_sealed(shared)
    assert not check.passed and check.severity.value == "WARN"  # ... and said on every run
    assert eval_vault_is_sealed(EvalVaultResource(root="/tmp/local-vault")).passed
