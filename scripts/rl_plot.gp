# gnuplot -e "dat='OUT/reward.dat'; png='docs/img/rl-reward.png'" scripts/rl_plot.gp
set terminal pngcairo size 900,420 font "sans,10" noenhanced
set output png
set multiplot layout 1,2
set xlabel "iteration"
set ylabel "mean reward of the rollouts"
set yrange [0:1]
set key bottom right
set grid
set title "Training reward (arithmetic)"
plot dat index 0 using 1:2 with lines lw 2 title "GRPO rollouts"
set title "Held-out pass@1 (200 problems, 4 samples each)"
set ylabel "pass@1"
plot dat index 1 using 1:2 with linespoints lw 2 pt 7 title "GRPO", \
     dat index 3 using 1:2 with linespoints lw 2 pt 5 title "SFT on references"
unset multiplot
