# A Kubernetes control-plane image (kube-apiserver, -controller-manager, -scheduler): the binary
# built with Go by scripts/kind-tools.sh on the debootstrap Debian base, where the official image
# has it (kubeadm's static pods run it by name from PATH).
FROM dlock-local/debian:bookworm
COPY @BIN@ /usr/local/bin/@BIN@
ENTRYPOINT ["/usr/local/bin/@BIN@"]
