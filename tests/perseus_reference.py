"""The Perseus authors' driver, transcribed as an independent reference for tests and benchmarks.

A line-for-line transcription of ``lowtime/scripts/perseus.py`` in the Perseus artifact
(``ml-energy/zeus``, branch ``kronos``): read the Zeus profile with pandas, build each instruction
type's options, filter them (strictly; again with ``noise_factor`` 0.95 when three or fewer
survive), subtract the P2P-blocking power over each option's quantized time, fit lowtime's
``ExponentialModel`` by its grid search (best fit), build the 1F1B DAG, run Phillips–Dessouky, and
report every step as the driver does: time ``result.real_time`` (quantized) and energy
``result.cost + stages · real_time · p_p2p``. It shares no code with ``kareus``.
"""

from __future__ import annotations

import itertools

import networkx as nx
import pandas as pd


def reference_frontier(csv: str, num_stages: int, num_mbs: int, p_p2p: float,
                       unit_time: float = 1e-3, noise_factor: float = 0.95
                       ) -> list[tuple[float, float, list[list[int]]]]:
    """Every solver step: (time s, energy J, per-stage frequencies in 1F1B order)."""
    from lowtime.cost_model import ExponentialModel
    from lowtime.graph_utils import DependencyResolver, add_sink_node, add_source_node
    from lowtime.operation import CandidateExecutionOptions, ExecutionOption, OperationSpec
    from lowtime.perseus.instruction import Backward, Forward, Instruction, backward_dep, forward_dep
    from lowtime.perseus.schedule import Synchronous1F1B
    from lowtime.solver import PhillipsDessouky

    inst_df = pd.read_csv(csv)
    op_spec_map: dict[int, dict[type, OperationSpec]] = {s: {} for s in range(num_stages)}
    for instruction in [Forward, Backward]:
        inst_name = instruction.__name__
        for stage_id in range(num_stages):
            options = []
            _df = inst_df.query(f"stage == {stage_id} and instruction == '{inst_name.lower()}'")
            for _, row in _df.iterrows():
                row = row.to_dict()
                options.append(ExecutionOption[int](real_time=row["time"], unit_time=unit_time,
                                                    cost=row["energy"],
                                                    knob=int(row["frequency"])))
            cand_options = CandidateExecutionOptions[int](options=options)
            if len(cand_options.options) <= 3:
                cand_options = CandidateExecutionOptions[int](options=options,
                                                              noise_factor=noise_factor)
            for option in cand_options.options:
                option.cost -= p_p2p * option.quant_time * option.unit_time
            model = ExponentialModel(cand_options, search_strategy="best")
            op_spec_map[stage_id][instruction] = OperationSpec[int](options=cand_options,
                                                                    cost_model=model)
    dag = nx.DiGraph()
    node_id = 2
    stage_insts: list[list] = []
    for stage_id in range(num_stages):
        stage_node_ids = []
        insts = []
        for inst in Synchronous1F1B(num_stages=num_stages, num_micro_batches=num_mbs,
                                    stage_id=stage_id, operation_spec_map=op_spec_map[stage_id]):
            dag.add_node(node_id, op=inst)
            stage_node_ids.append(node_id)
            insts.append(inst)
            node_id += 1
        for id1, id2 in zip(stage_node_ids, stage_node_ids[1:]):
            dag.add_edge(id1, id2)
        stage_insts.append(insts)
    resolver = DependencyResolver(dependency_rules=[forward_dep, backward_dep],
                                  node_type=Instruction)
    nodes = list(dag.nodes(data=True))
    for (id1, data1), (id2, data2) in itertools.product(nodes, nodes):
        if resolver.is_dependent(data1["op"], data2["op"]):
            dag.add_edge(id1, id2)
    add_source_node(dag, 0)
    add_sink_node(dag, 1)
    dag.graph["source_node"] = 0
    dag.graph["sink_node"] = 1
    out = []
    for result in PhillipsDessouky(dag).run():
        real_cost = result.cost + num_stages * result.real_time * p_p2p
        out.append((float(result.real_time), float(real_cost),
                    [[inst.assigned_knob for inst in insts] for insts in stage_insts]))
    return out
