# kube-proxy runs in nftables mode here (e2e/kind/cluster.yaml): it needs nft, and conntrack and
# iptables for the cleanup of other modes' rules it does at start.
FROM dlock-local/debian:bookworm
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends nftables iptables conntrack kmod \
    && rm -rf /var/lib/apt/lists/*
COPY kube-proxy /usr/local/bin/kube-proxy
ENTRYPOINT ["/usr/local/bin/kube-proxy"]
