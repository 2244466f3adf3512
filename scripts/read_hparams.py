"""Reads a population's log directory with TensorBoard's own HParams plugin (what its
HParams view shows) and prints it as JSON: the experiment's hyperparameters and
metrics, and each session group (a configuration) with its sessions (agents), their
hyperparameters, status and metric values.

    python scripts/read_hparams.py runs/sweep
"""

import json
import sys

from tensorboard import context
from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
from tensorboard.plugins import base_plugin
from tensorboard.plugins.hparams import api_pb2, get_experiment, hparams_plugin
from tensorboard.plugins.hparams import list_session_groups


def main(logdir):
    mux = plugin_event_multiplexer.EventMultiplexer()
    mux.AddRunsFromDirectory(logdir)
    mux.Reload()
    provider = data_provider.MultiplexerDataProvider(mux, logdir)
    tb = base_plugin.TBContext(logdir=logdir, multiplexer=mux, data_provider=provider)
    plugin = hparams_plugin.HParamsPlugin(tb)
    ctx = context.RequestContext()
    experiment = get_experiment.Handler(
        ctx, plugin._context, "", api_pb2.GetExperimentRequest()
    ).run()
    request = api_pb2.ListSessionGroupsRequest(start_index=0, slice_size=1_000_000)
    request.allowed_statuses.extend(
        [api_pb2.STATUS_UNKNOWN, api_pb2.STATUS_SUCCESS, api_pb2.STATUS_FAILURE, api_pb2.STATUS_RUNNING]
    )
    groups = list_session_groups.Handler(ctx, plugin._context, "", request).run()

    def value(v):
        kind = v.WhichOneof("kind")
        return getattr(v, kind) if kind else None

    out = {
        "hparams": [h.name for h in experiment.hparam_infos],
        "metrics": [m.name.tag for m in experiment.metric_infos],
        "groups": [
            {
                "name": g.name,
                "hparams": {k: value(v) for k, v in g.hparams.items()},
                "sessions": [
                    {
                        "name": s.name,
                        "status": api_pb2.Status.Name(s.status),
                        "metrics": {m.name.tag: m.value for m in s.metric_values},
                    }
                    for s in g.sessions
                ],
            }
            for g in groups.session_groups
        ],
    }
    json.dump(out, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main(sys.argv[1])
