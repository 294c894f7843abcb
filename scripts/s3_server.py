#!/usr/bin/env python3
"""A local S3-compatible server for the object-storage tests (tests/fit_object_store.rs).

Never used at run time. Starts moto's S3 server on a loopback port with authentication on,
creates one IAM user whose key may do anything and one bucket, prints one JSON line
{"endpoint", "access_key", "secret_key", "bucket"} on stdout, then serves until stdin closes
(the test holds the pipe; when it exits, the server goes too).

    python scripts/s3_server.py [--bucket receipts]
"""

import argparse
import json
import os
import sys

# Authentication is on from the first request but three: the IAM calls below, unsigned.
os.environ["INITIAL_NO_AUTH_ACTION_COUNT"] = "3"

from importlib.metadata import version  # noqa: E402

# Older moto computes a listing's signature differently from the AWS SDKs (and object_store).
if tuple(int(x) for x in version("moto").split(".")[:3]) < (5, 2, 5):
    sys.exit(f"moto {version('moto')} is too old: 5.2.5 or newer is needed (scripts/requirements-s3.txt)")

import boto3  # noqa: E402
from moto.server import ThreadedMotoServer  # noqa: E402

POLICY = json.dumps({"Version": "2012-10-17",
                     "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bucket", default="receipts")
    args = ap.parse_args()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    anon = dict(endpoint_url=endpoint, region_name="us-east-1",
                aws_access_key_id="bootstrap", aws_secret_access_key="bootstrap")
    iam = boto3.client("iam", **anon)
    iam.create_user(UserName="fit")
    iam.put_user_policy(UserName="fit", PolicyName="all", PolicyDocument=POLICY)
    key = iam.create_access_key(UserName="fit")["AccessKey"]
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                      aws_access_key_id=key["AccessKeyId"], aws_secret_access_key=key["SecretAccessKey"])
    s3.create_bucket(Bucket=args.bucket)
    print(json.dumps({"endpoint": endpoint, "access_key": key["AccessKeyId"],
                      "secret_key": key["SecretAccessKey"], "bucket": args.bucket}), flush=True)
    sys.stdin.read()
    server.stop()


if __name__ == "__main__":
    main()
