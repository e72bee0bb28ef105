"""A node started with defaults is not open to its LAN. Before: the API listened on 0.0.0.0
with no key, so anyone on the LAN could place and delete instances, read /state and use the
store. Now a real node in its own network namespace, reached from another namespace (another
machine on the LAN, as far as the node can tell):

- refuses every route without its key (401 in the caller's wire shape), and with a wrong one;
- answers with the key it created on first start (what `skulk api-key` prints);
- refuses a forged Host header (DNS rebinding) even with the key;
- serves its dashboard's static page without a key.
"""

from __future__ import annotations

import json
import subprocess
import sys

from tests.netns import curl_from, two_namespaces  # noqa: F401 - fixture


def test_a_default_node_requires_its_key_from_the_lan(spawn_node, two_namespaces):
    names, addresses = two_namespaces
    node = spawn_node("guarded", netns=names[0], api_host=addresses[0], port=52415,
                      extra_args=["--cluster-key", "netns-key", "--node-name", "guarded"])
    node.wait_ready()
    url = f"http://{addresses[0]}:52415"
    key = node.api_key
    assert key and (node.data_dir / "api.key").stat().st_mode & 0o077 == 0
    printed = subprocess.run([sys.executable, "-m", "skulk", "api-key", "--data-dir", str(node.data_dir)],
                             capture_output=True, text=True, timeout=30)
    assert printed.stdout.strip() == key

    lan = names[1]
    for method, path, body in [("GET", "/v1/models", None), ("GET", "/state", None),
                               ("POST", "/place_instance", '{"modelId": "local/tiny-llama-gguf"}'),
                               ("DELETE", "/store/models/local/tiny-llama-gguf", None),
                               ("POST", "/v1/cancel/abc", None), ("GET", "/ollama/api/tags", None)]:
        status, text = curl_from(lan, url + path, method=method, body=body)
        assert status == 401, (path, status, text)
        status, _ = curl_from(lan, url + path, method=method, body=body, headers={"Authorization": "Bearer nope"})
        assert status == 401, path
    status, text = curl_from(lan, url + "/v1/models")
    assert json.loads(text)["error"]["code"] == "invalid_api_key"
    status, text = curl_from(lan, url + "/v1/messages", method="POST", body="{}", headers={"x-api-key": "nope"})
    assert status == 401 and json.loads(text)["error"]["type"] == "authentication_error"

    status, text = curl_from(lan, url + "/v1/models", headers={"Authorization": f"Bearer {key}"})
    assert status == 200, text
    status, text = curl_from(lan, url + "/state", headers={"Authorization": f"Bearer {key}", "Host": "evil.example"})
    assert status == 403 and "host_not_allowed" in text
    status, _ = curl_from(lan, url + "/")
    assert status != 401
