#!/usr/bin/env bash
# One learner host and N generation hosts over SSH (no shared filesystem assumed).
#   LEARNER=10.0.0.1 PRODUCERS="10.0.0.2 10.0.0.3" MODEL=/models/qwen bash ssh.sh
# Needs: asyncgrpo installed on every host (vllm extra on GPU hosts), the model at $MODEL on each.
set -euo pipefail
: "${LEARNER:?set LEARNER}" "${PRODUCERS:?set PRODUCERS}" "${MODEL:?set MODEL}"
RUN=${RUN:-runs/$(date +%Y%m%d-%H%M%S)}
KEYS=${KEYS:-keys}
[ -d "$KEYS" ] || asyncgrpo keys "$KEYS"
ssh "$LEARNER" "mkdir -p $RUN" && scp -q -r "$KEYS" "$LEARNER:$RUN/keys"
ssh "$LEARNER" "cd $RUN/.. && nohup asyncgrpo consumer --bind 0.0.0.0 --keys $RUN/keys \
    --model $MODEL --run-dir $RUN ${CONSUMER_ARGS:-} > $RUN/consumer.out 2>&1 &"
for host in $PRODUCERS; do
  scp -q -r "$KEYS" "$host:/tmp/asyncgrpo-keys"
  ssh "$host" "nohup asyncgrpo producer --connect tcp://$LEARNER:5555 --keys /tmp/asyncgrpo-keys \
      --engine vllm --model $MODEL --id $host ${PRODUCER_ARGS:-} > /tmp/asyncgrpo-producer.out 2>&1 &"
done
echo "learner: ssh $LEARNER tail -f $RUN/consumer.log    report: asyncgrpo report $RUN"
