#!/usr/bin/env bash
# One learner host and N generation hosts over SSH (no shared filesystem assumed).
#   LEARNER=10.0.0.1 PRODUCERS="10.0.0.2 10.0.0.3" MODEL=/models/qwen bash ssh.sh [--dry-run]
# Needs: asyncgrpo installed on every host (vllm extra on GPU hosts), the model at $MODEL on each.
# Keys: one pair per producer host (named after the host); the learner gets keys/server and the
# allowlist keys/clients, each producer host only its own keys/producers/HOST.
# --dry-run prints every command (one per line) instead of running it.
set -euo pipefail
DRY=""
if [ "${1:-}" = "--dry-run" ]; then DRY=1; fi
run() { if [ -n "$DRY" ]; then printf '%q ' "$@" | sed 's/ $//'; echo; else "$@"; fi; }
: "${LEARNER:?set LEARNER}" "${PRODUCERS:?set PRODUCERS}" "${MODEL:?set MODEL}"
RUN=${RUN:-runs/$(date +%Y%m%d-%H%M%S)}
KEYS=${KEYS:-keys}
HOST_KEYS=asyncgrpo-keys-$(basename "$RUN")   # in each producer's home directory
names=()
for host in $PRODUCERS; do names+=(--producer "$host"); done
run asyncgrpo keys "$KEYS" "${names[@]}"
run ssh "$LEARNER" "mkdir -p $RUN/keys"
run scp -q -r "$KEYS/server" "$KEYS/clients" "$LEARNER:$RUN/keys/"
run ssh "$LEARNER" "nohup asyncgrpo consumer --bind 0.0.0.0 --keys $RUN/keys \
--model $MODEL --run-dir $RUN ${CONSUMER_ARGS:-} > $RUN/consumer.out 2>&1 &"
for host in $PRODUCERS; do
  run scp -q -r "$KEYS/producers/$host" "$host:$HOST_KEYS"
  run ssh "$host" "nohup asyncgrpo producer --connect tcp://$LEARNER:5555 --keys $HOST_KEYS \
--engine vllm --model $MODEL --id $host ${PRODUCER_ARGS:-} > asyncgrpo-producer.out 2>&1 &"
done
echo "learner: ssh $LEARNER tail -f $RUN/consumer.log   status: ssh $LEARNER asyncgrpo status $RUN"
