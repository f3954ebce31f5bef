// The launch-script reader (bridges/shell_script.h): every shell form it evaluates, what it leaves
// unresolved (named with file and line), and the text it refuses.
#include "bridges/shell_script.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace stowage::bridges {
namespace {

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

ShellScript Read(const std::string& text, std::vector<std::string> args = {},
                 std::map<std::string, std::string> env = {}) {
  auto s = ReadShellScript(text, "job.sh", ShellEnvironment{std::move(args), std::move(env)});
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *s : ShellScript{};
}

// The words of the n-th recorded command.
std::vector<std::string> Words(const ShellScript& s, size_t n) {
  std::vector<std::string> out;
  if (n >= s.commands.size()) return {"<no command " + std::to_string(n) + ">"};
  for (const ShellWord& w : s.commands[n].words) out.push_back(w.text);
  return out;
}

std::string Value(const ShellScript& s, const std::string& name) {
  auto it = s.variables.find(name);
  return it == s.variables.end() || it->second.values.empty() ? "<unset>" : it->second.values[0];
}

TEST(ShellScript, AssignmentsExportsAndDefaults) {
  const ShellScript s = Read(
      "A=1\n"
      "export B=\"two words\" C=3\n"
      "D=${UNSET:-dflt} E=${A:-x} F=${UNSET-dash} G=${A:+alt} H=${EMPTY:+alt}\n"
      "I=${NEW:=made}\n"
      "J=${#B} K=${B#two } L=${B% words} M=${B/two/2} N=${B^^}\n"
      "P='$A literal' Q=\"$A-${A}x\"\n"
      "R=abc\n"
      "R+=def\n");
  EXPECT_EQ(Value(s, "A"), "1");
  EXPECT_EQ(Value(s, "B"), "two words");
  EXPECT_EQ(Value(s, "C"), "3");
  EXPECT_EQ(Value(s, "D"), "dflt");
  EXPECT_EQ(Value(s, "E"), "1");
  EXPECT_EQ(Value(s, "F"), "dash");
  EXPECT_EQ(Value(s, "G"), "alt");
  EXPECT_EQ(Value(s, "H"), "");
  EXPECT_EQ(Value(s, "I"), "made");
  EXPECT_EQ(Value(s, "NEW"), "made");
  EXPECT_EQ(Value(s, "J"), "9");
  EXPECT_EQ(Value(s, "K"), "words");
  EXPECT_EQ(Value(s, "L"), "two");
  EXPECT_EQ(Value(s, "M"), "2 words");
  EXPECT_EQ(Value(s, "N"), "TWO WORDS");
  EXPECT_EQ(Value(s, "P"), "$A literal");
  EXPECT_EQ(Value(s, "Q"), "1-1x");
  EXPECT_EQ(Value(s, "R"), "abcdef");
  EXPECT_THAT(s.unresolved, IsEmpty());
}

TEST(ShellScript, ArithmeticAndTheEnvironment) {
  const ShellScript s = Read(
      "GPUS_PER_NODE=8\n"
      "NNODES=${SLURM_NNODES:-1}\n"
      "WORLD_SIZE=$(($GPUS_PER_NODE*$NNODES))\n"
      "X=$(( (WORLD_SIZE + 2) / 3 % 4 ** 2 ))\n"
      "Y=$(( NNODES > 2 ? 10 : 20 ))\n",
      {}, {{"SLURM_NNODES", "4"}});
  EXPECT_EQ(Value(s, "WORLD_SIZE"), "32");
  EXPECT_EQ(Value(s, "X"), "11");
  EXPECT_EQ(Value(s, "Y"), "10");
  EXPECT_EQ(*ShellArithmetic("1 + 2 * 3 - 4 / 2", {}), 5);
  EXPECT_EQ(*ShellArithmetic("(1 << 4) | 1 && !0", {}), 1);
  EXPECT_EQ(*ShellArithmetic("-2 ** 2 + A", {{"A", "3"}}), 7);
  EXPECT_THAT(ShellArithmetic("1 / 0", {}).status().message(), HasSubstr("division by 0"));
  EXPECT_THAT(ShellArithmetic("9223372036854775807 + 1", {}).status().message(),
              HasSubstr("overflow"));
  EXPECT_THAT(ShellArithmetic("A * 2", {{"A", "x y"}}).status().message(), HasSubstr("A is"));
}

TEST(ShellScript, ArraysAppendsAndTheirExpansions) {
  const ShellScript s = Read(
      "MODEL=(\n"
      "  --num-layers 32   # a comment (with parentheses)\n"
      "  --hidden-size 4096\n"
      ")\n"
      "EXTRA=()\n"
      "EXTRA+=(\"--fp8-format hybrid\" --bf16)\n"
      "MODEL+=(\"${EXTRA[@]}\")\n"
      "echo ignored\n"
      "python train.py \"${MODEL[@]}\" ${EXTRA[@]} ${#MODEL[@]} ${MODEL[1]}\n");
  EXPECT_THAT(Words(s, 0), ElementsAre("python", "train.py", "--num-layers", "32", "--hidden-size",
                                       "4096", "--fp8-format hybrid", "--bf16", "--fp8-format",
                                       "hybrid", "--bf16", "6", "32"));
}

TEST(ShellScript, ContinuationsQuotesAndFieldSplitting) {
  const ShellScript s = Read(
      "ARGS=\"--a 1 --b   2\"\n"
      "torchrun --nproc_per_node 8 \\\n"
      "    pretrain.py \\\n"
      "    $ARGS \"$ARGS\" '--c 3' \\\n"
      "    --d\\ 4 \"\" 2>&1 | tee log.txt\n");
  ASSERT_EQ(s.commands.size(), 2u);
  EXPECT_EQ(s.commands[0].line, 2);
  EXPECT_THAT(Words(s, 0), ElementsAre("torchrun", "--nproc_per_node", "8", "pretrain.py", "--a",
                                       "1", "--b", "2", "--a 1 --b   2", "--c 3", "--d 4", ""));
  EXPECT_THAT(Words(s, 1), ElementsAre("tee", "log.txt"));
}

TEST(ShellScript, PositionalParametersAfterTheDoubleDash) {
  const ShellScript s = Read(
      "CKPT=$1\nTEN=${10}\nCOUNT=$#\nALL=\"$*\"\nTOK=${3:-MOCK}\nMISSING=$3\n"
      "set -- x y\nAFTER=$1$2\nshift\nSHIFTED=$1\n",
      {"/ckpt", "b", "", "d", "e", "f", "g", "h", "i", "tenth"});
  EXPECT_EQ(Value(s, "CKPT"), "/ckpt");
  EXPECT_EQ(Value(s, "TEN"), "tenth");
  EXPECT_EQ(Value(s, "COUNT"), "10");
  EXPECT_EQ(Value(s, "TOK"), "MOCK");  // $3 is empty: ${3:-MOCK}
  EXPECT_EQ(Value(s, "AFTER"), "xy");
  EXPECT_EQ(Value(s, "SHIFTED"), "y");
  const ShellScript none = Read("VOCAB=$3\nTOK=${3:-MOCK}\n");
  EXPECT_EQ(Value(none, "TOK"), "MOCK");
  EXPECT_THAT(none.variables.at("VOCAB").unresolved, HasSubstr("job.sh:1: $3 is not given"));
}

TEST(ShellScript, ConditionalsOnKnownValues) {
  const ShellScript s = Read(
      "DTYPE=fp8\nMODE=${MODE:-b}\n"
      "if [[ \"$DTYPE\" == \"fp8\" ]]; then A=yes; elif [ -n \"$X\" ]; then A=elif; else A=no; fi\n"
      "if [ \"$DTYPE\" = bf16 ] || [ 3 -gt 2 ]; then B=or; fi\n"
      "if test -z \"$UNSET\" && ! [ 1 -eq 2 ]; then C=and; else C=not; fi\n"
      "case \"$MODE\" in\n"
      "  a|aa) D=first ;;\n"
      "  b*) D=second ;;\n"
      "  *) D=default ;;\n"
      "esac\n"
      "[ -z \"$E\" ] && E=set || E=never\n");
  EXPECT_EQ(Value(s, "A"), "yes");
  EXPECT_EQ(Value(s, "B"), "or");
  EXPECT_EQ(Value(s, "C"), "and");
  EXPECT_EQ(Value(s, "D"), "second");
  EXPECT_EQ(Value(s, "E"), "set");
  EXPECT_THAT(s.unresolved, IsEmpty());
}

TEST(ShellScript, UnknownConditionsAreNamedNotGuessed) {
  const ShellScript s = Read(
      "TP=1\n"
      "if [ -f /etc/big_cluster ]; then\n"
      "  TP=8\n"
      "  echo big\n"
      "  exit 1\n"
      "fi\n"
      "if [ ! -d /ckpt ]; then mkdir -p /ckpt; fi\n"
      "python train.py --tp $TP\n");
  EXPECT_THAT(s.variables.at("TP").unresolved,
              HasSubstr("job.sh:2: TP is set in a branch whose condition stowage cannot decide"));
  ASSERT_EQ(s.commands.size(), 2u);  // exit in an undecided branch does not end the script
  EXPECT_TRUE(s.commands[0].conditional);
  EXPECT_FALSE(s.commands[1].conditional);
  EXPECT_THAT(s.commands[1].words[3].unresolved, HasSubstr("TP is set in a branch"));
  EXPECT_THAT(s.unresolved, Contains(HasSubstr("job.sh:2: the test -f /etc/big_cluster")));
}

TEST(ShellScript, CommandSubstitutionsAreNotRun) {
  const ShellScript s =
      Read("N=$(python -c 'print(8)')\nM=`hostname`\nmkdir -p \"$(dirname \"$N\")\"\n");
  EXPECT_THAT(s.variables.at("N").unresolved,
              HasSubstr("job.sh:1: $(python -c 'print(8)') is a command substitution; stowage "
                        "does not run it"));
  EXPECT_THAT(s.variables.at("M").unresolved, HasSubstr("job.sh:2: `hostname`"));
  EXPECT_THAT(s.unresolved, Contains(HasSubstr("job.sh:3: $(dirname")));
}

TEST(ShellScript, EvalOfABuiltCommandLine) {
  const ShellScript s = Read(
      "CMD=\"torchrun --nproc_per_node 4\"\n"
      "CMD=\"$CMD pretrain_gpt.py --num-layers 2\"\n"
      "eval $CMD \"--seq-length 4096\"\n");
  EXPECT_THAT(Words(s, 0), ElementsAre("torchrun", "--nproc_per_node", "4", "pretrain_gpt.py",
                                       "--num-layers", "2", "--seq-length", "4096"));
  EXPECT_EQ(s.commands[0].line, 3);
}

TEST(ShellScript, LoopsFunctionsAndExit) {
  const ShellScript s = Read(
      "while [[ $# -gt 0 ]]; do\n"
      "  case $1 in\n"
      "    --layers) LAYERS=\"$2\"; shift 2 ;;\n"
      "    *) shift ;;\n"
      "  esac\n"
      "done\n"
      "for n in 1 2 3; do SUM=$(( ${SUM:-0} + n )); done\n"
      "launch() {\n"
      "  torchrun --nnodes \"$1\" train.py --num-layers $LAYERS\n"
      "}\n"
      "launch 2\n"
      "exit 0\n"
      "python never.py --x 1\n",
      {"--other", "--layers", "12"});
  EXPECT_EQ(Value(s, "LAYERS"), "12");
  EXPECT_EQ(Value(s, "SUM"), "6");
  ASSERT_EQ(s.commands.size(), 1u);
  EXPECT_THAT(Words(s, 0),
              ElementsAre("torchrun", "--nnodes", "2", "train.py", "--num-layers", "12"));
  EXPECT_EQ(s.commands[0].line, 9);
}

TEST(ShellScript, HereDocumentsForSbatchAndBashMinusC) {
  const ShellScript s = Read(
      "NODES=4\n"
      "TRAIN=\"cd /m; python /m/pretrain_gpt.py --tensor-model-parallel-size 2\"\n"
      "sbatch <<EOF\n"
      "#!/bin/bash\n"
      "#SBATCH --nodes=${NODES}\n"
      "#SBATCH --ntasks-per-node 8\n"
      "srun --container-image=x bash -x -c \"${TRAIN}\" 2>&1 | tee \\${SLURM_JOB_ID}.log\n"
      "EOF\n"
      "cat > notes.txt <<'END'\n"
      "#SBATCH --nodes=99\n"
      "END\n");
  ASSERT_EQ(s.sbatch.size(), 2u);
  EXPECT_EQ(s.sbatch[0].name, "nodes");
  EXPECT_EQ(s.sbatch[0].value, "4");
  EXPECT_EQ(s.sbatch[0].line, 5);
  EXPECT_EQ(s.sbatch[1].value, "8");
  std::vector<std::vector<std::string>> all;
  for (size_t i = 0; i < s.commands.size(); ++i) all.push_back(Words(s, i));
  EXPECT_THAT(all, Contains(ElementsAre("srun", "--container-image=x")));
  EXPECT_THAT(all, Contains(ElementsAre("python", "/m/pretrain_gpt.py",
                                        "--tensor-model-parallel-size", "2")));
  // The job id is the batch system's: unset here.
  EXPECT_THAT(all, Contains(ElementsAre("tee", ".log")));
}

TEST(ShellScript, TextThatIsNotShellIsRefusedWithItsLine) {
  for (const auto& [text, message] : std::vector<std::pair<std::string, std::string>>{
           {"A=1\nB=\"open\n", "job.sh:2: the quote \" opened here has no end"},
           {"X=1\nfi\n", "job.sh:2: unexpected 'fi'"},
           {"if true; then\nA=1\n", "job.sh:2: expected 'fi' before the end of the file"},
           {"ARR=(a b\n", "an array's '(' has no ')'"},
           {"cat <<EOF\nbody\n", "the here-document ending in 'EOF' has no end"},
           {"A=$(( 1 +", "job.sh:1: '(' has no matching ')'"},
       }) {
    auto s = ReadShellScript(text, "job.sh", {});
    ASSERT_FALSE(s.ok()) << text;
    EXPECT_THAT(s.status().message(), HasSubstr(message)) << text;
  }
}

TEST(ShellScript, EndlessLoopsAndDeepEvalsStop) {
  const ShellScript loop = Read("while true; do X=1; done\n");
  EXPECT_THAT(loop.unresolved, Contains(HasSubstr("job.sh:1: this loop was read 1000 times")));
  // Nested endless loops stop too: a budget for all loops together.
  const ShellScript nested =
      Read("while true; do while true; do while true; do X=1; done; done; done\n");
  EXPECT_THAT(nested.unresolved, Contains(HasSubstr("(at most 1000 a loop, 20000 in all)")));
  const ShellScript deep = Read("f() { f; }\nf\n");
  EXPECT_TRUE(deep.commands.empty());
  EXPECT_THAT(deep.unresolved, Contains(HasSubstr("more than 32 deep (the function f)")));
}

// Nothing recursive runs unbounded on a hostile file: deep nesting is refused or unresolved.
TEST(ShellScript, DeepNestingIsBounded) {
  const int n = 100000;
  std::string groups;
  for (int i = 0; i < n; ++i) groups += "{ ";
  groups += "true; ";
  for (int i = 0; i < n; ++i) groups += "}; ";
  auto deep_group = ReadShellScript(groups, "job.sh", {});
  ASSERT_FALSE(deep_group.ok());
  EXPECT_THAT(deep_group.status().message(), HasSubstr("commands nested more than 200 deep"));
  const ShellScript arithmetic = Read("X=$((" + std::string(n, '(') + "1" + std::string(n, ')') +
                                      "))\nY=$((" + std::string(n, '-') + "1))\n");
  EXPECT_THAT(arithmetic.variables.at("X").unresolved, HasSubstr("nested more than 256 deep"));
  EXPECT_THAT(arithmetic.variables.at("Y").unresolved, HasSubstr("nested more than 256 deep"));
  std::string nested = "x";
  for (int i = 0; i < 2000; ++i) nested = "${A:-" + nested + "}";
  const ShellScript expansion = Read("X=" + nested + "\n");
  EXPECT_THAT(expansion.variables.at("X").unresolved, HasSubstr("nested more than 64 deep"));
}

}  // namespace
}  // namespace stowage::bridges
