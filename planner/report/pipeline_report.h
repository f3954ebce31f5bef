// What users and the runtime read of a pipelined run (planner/search/pipeline.h PlanPipeline): its
// plan, every layer with its stage's choices, and the per-stage table with the pipeline's lines
// of the summary.
#ifndef STOWAGE_PLANNER_REPORT_PIPELINE_REPORT_H_
#define STOWAGE_PLANNER_REPORT_PIPELINE_REPORT_H_

#include <string>

#include "planner/report/report.h"
#include "planner/search/pipeline.h"
#include "stowage/plan.h"

namespace stowage::planner {

// The plan of a pipelined run: every layer with its stage's choices, one section per stage, the
// whole step's predictions (peak and host bytes: the binding stage's). Passes ValidatePlan.
Plan MakePipelinePlan(const PipelineResult& pipeline, const PlanLabels& labels);

// The per-stage table (layers, peaks, in-flight counts, time) and the lines the summary adds for
// the pipeline: the binding and the slowest stage, bubble and point-to-point time.
std::string RenderStageTable(const PipelineResult& pipeline, const Plan& plan);

}  // namespace stowage::planner

#endif  // STOWAGE_PLANNER_REPORT_PIPELINE_REPORT_H_
